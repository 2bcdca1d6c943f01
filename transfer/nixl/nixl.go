//go:build cgo

package nixl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "capi.h"
#include "calls.h"
*/
import "C"

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/internal/poll"
)

// Agent is a transfer.Agent backed by NIXL's nixlAgent, created through
// NIXL's C API. The agent is created with NIXL's strict thread
// synchronisation and (unless disabled) its progress thread, so all methods
// are safe for concurrent use.
//
// NIXL keeps pointers to registered memory: register Buffers or memory
// allocated outside Go (device memory included), never Go heap memory.
type Agent struct {
	lib  *C.kv_nixl
	h    C.kv_agent
	name string
	log  *slog.Logger

	// mu is held for reading around every call into NIXL and for writing by
	// Close, so the native agent is never used after it was destroyed.
	mu     sync.RWMutex
	closed bool // set by Close under mu

	state sync.Mutex // protects the fields below
	// regions are the registered ranges, to check local descriptors.
	regions []region
	// regionSeq numbers registrations; deregs counts deregistrations, so
	// that requests and prepared lists re-check their memory only after
	// one.
	regionSeq, deregs uint64
	// remotes are the agents whose metadata is loaded.
	remotes map[string]bool
	// backends are the backends created, in order.
	backends []*backend
	// handles are the live requests and prepared lists, released by Close.
	handles map[handle]struct{}

	notifMu sync.Mutex // serialises the notification map
	nmap    C.kv_notif_map
}

// region is a registered range. NIXL's requests and prepared lists keep
// pointers into the registration they were made with, so they name the
// regions they use by id: a region deregistered and registered again is
// another region to them.
type region struct {
	kind transfer.MemKind
	desc transfer.Desc
	// meta is the descriptor's backend bytes, to deregister it on Close.
	meta []byte
	id   uint64
}

// regionIndex returns the index of the registration of exactly d, or -1.
// The caller holds a.state.
func (a *Agent) regionIndex(kind transfer.MemKind, d transfer.Desc) int {
	return slices.IndexFunc(a.regions, func(r region) bool { return r.kind == kind && r.desc == d })
}

// registered reports, with an ErrNotRegistered error, whether a region of
// regs was deregistered since the request or list holding them was made.
// It checks only when memory was deregistered since *gen, and records the
// generation it checked in *gen.
func (a *Agent) registered(op, remote string, regs []uint64, gen *uint64) error {
	a.state.Lock()
	defer a.state.Unlock()
	if *gen == a.deregs {
		return nil
	}
	for _, id := range regs {
		if !slices.ContainsFunc(a.regions, func(r region) bool { return r.id == id }) {
			// NIXL would move bytes out of or into memory the host may
			// have freed, through a registration it freed.
			return a.errorf(op, remote, transfer.ErrNotRegistered, "local memory was deregistered after the request or list was made; make it again")
		}
	}
	*gen = a.deregs
	return nil
}

var _ transfer.Agent = (*Agent)(nil)

// load opens the first library candidate that loads and reports every
// failure otherwise.
func load(libPath string) (*C.kv_nixl, error) {
	var tried []string
	errBuf := (*C.char)(C.malloc(1024))
	defer C.free(unsafe.Pointer(errBuf))
	for _, p := range defaultCandidates(libPath) {
		cp := C.CString(p)
		lib := C.kv_open(cp, errBuf, 1024)
		C.free(unsafe.Pointer(cp))
		if lib != nil {
			return lib, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%s)", p, C.GoString(errBuf)))
	}
	return nil, fmt.Errorf("%w: nixl: cannot load %s; tried: %s", transfer.ErrUnavailable, LibName, strings.Join(tried, "; "))
}

// New loads NIXL, creates an agent and its configured backends. Errors:
// transfer.ErrUnavailable when the library cannot be loaded (the message
// names every path tried), transfer.ErrNotSupported for a plugin NIXL does
// not have, transfer.ErrBackend when NIXL refuses.
func New(cfg Config) (*Agent, error) {
	if cfg.Name == "" || strings.IndexByte(cfg.Name, 0) >= 0 {
		return nil, fmt.Errorf("%w: nixl: agent name %q", transfer.ErrInvalidParam, cfg.Name)
	}
	lib, err := load(cfg.LibPath)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a := &Agent{lib: lib, name: cfg.Name, log: log.With("agent", cfg.Name),
		remotes: map[string]bool{}, handles: map[handle]struct{}{}}
	cname := C.CString(cfg.Name)
	defer C.free(unsafe.Pointer(cname))
	if st := C.kv_create_agent(lib, cname, C.bool(!cfg.NoProgressThread), C.KV_SYNC_STRICT, 0, &a.h); st != C.KV_CAPI_SUCCESS {
		C.free(unsafe.Pointer(lib))
		return nil, a.fail("create agent", "", st, transfer.ErrBackend, transfer.ErrBackend)
	}
	if st := C.cgoCreateNotifMap(lib, &a.nmap); st != C.KV_CAPI_SUCCESS {
		C.cgoDestroyAgent(lib, a.h)
		C.free(unsafe.Pointer(lib))
		return nil, a.fail("create notification map", "", st, transfer.ErrBackend, transfer.ErrBackend)
	}
	plugins := cfg.Backends
	if len(plugins) == 0 {
		plugins = []string{"UCX"}
	}
	for _, p := range plugins {
		if _, err := a.CreateBackend(p, cfg.BackendParams[p]); err != nil {
			_ = a.Close()
			return nil, err
		}
	}
	return a, nil
}

// fail builds the error of a failed NIXL call. The C API folds most of
// NIXL's statuses into NIXL_CAPI_ERROR_BACKEND, and NIXL_CAPI_ERROR_NOT_FOUND
// stands for something different in each call, so the caller classifies
// both: onBackend and onNotFound. What NOT_FOUND means, from NIXL's agent:
// no backend for the memory kind in registerMem and deregisterMem, no such
// plugin in createBackend, a remote agent whose metadata is not (or no
// longer) loaded in makeXferReq, postXferReq, getXferStatus, genNotif and
// invalidateRemoteMD, and any of those or memory outside the remote's
// registrations in prepXferDlist and createXferReq (whose C wrapper reports
// every failure as BACKEND).
func (a *Agent) fail(op, remote string, st C.kv_status, onBackend, onNotFound error) error {
	var cls error
	switch st {
	case C.KV_CAPI_ERROR_INVALID_PARAM:
		cls = transfer.ErrInvalidParam
	case C.KV_CAPI_ERROR_NOT_FOUND:
		cls = onNotFound
	case C.KV_CAPI_ERROR_NO_TELEMETRY:
		cls = transfer.ErrNotSupported
	case C.KV_CAPI_ERROR_BACKEND:
		cls = onBackend
	default:
		cls = transfer.ErrBackend
	}
	return &transfer.Error{Op: op, Agent: a.name, Remote: remote, Code: int(st), Err: cls}
}

func (a *Agent) errorf(op, remote string, err error, format string, args ...any) error {
	return transfer.Errorf(a.name, op, remote, err, format, args...)
}

// enter takes the read lock for a call into NIXL, failing after Close.
func (a *Agent) enter(op string) error {
	a.mu.RLock()
	if a.closed {
		a.mu.RUnlock()
		return a.errorf(op, "", transfer.ErrClosed, "")
	}
	return nil
}

func (a *Agent) leave() { a.mu.RUnlock() }

// Name returns the agent's name.
func (a *Agent) Name() string { return a.name }

// takeBuf copies and frees a kv_buf.
func takeBuf(b *C.kv_buf) []byte {
	defer C.free(unsafe.Pointer(b.data))
	if b.len == 0 {
		return nil
	}
	return C.GoBytes(unsafe.Pointer(b.data), C.int(b.len))
}

// splitRecords splits a buffer of u32-length-prefixed records.
func splitRecords(b []byte) ([][]byte, bool) {
	var out [][]byte
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, false
		}
		n := binary.LittleEndian.Uint32(b)
		if uint64(len(b)-4) < uint64(n) {
			return nil, false
		}
		out = append(out, b[4:4+n])
		b = b[4+n:]
	}
	return out, true
}

// Plugins lists the plugins NIXL found.
func (a *Agent) Plugins() ([]string, error) {
	if err := a.enter("plugins"); err != nil {
		return nil, err
	}
	defer a.leave()
	var buf C.kv_buf
	st := C.kv_plugins(a.lib, a.h, &buf)
	recs, ok := splitRecords(takeBuf(&buf))
	if st != C.KV_CAPI_SUCCESS || !ok {
		return nil, a.fail("plugins", "", st, transfer.ErrBackend, transfer.ErrBackend)
	}
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r)
	}
	return out, nil
}

// backend is a NIXL backend handle.
type backend struct {
	// a is the agent that created the backend; h is valid until a's Close.
	a      *Agent
	plugin string
	h      C.kv_backend
	mems   []transfer.MemKind
	params map[string]string
}

// Plugin returns the NIXL plugin name.
func (b *backend) Plugin() string { return b.plugin }

// MemKinds returns the memory kinds NIXL reports for the backend.
func (b *backend) MemKinds() []transfer.MemKind { return slices.Clone(b.mems) }

// Params returns the backend parameters NIXL reports.
func (b *backend) Params() map[string]string { return copyMap(b.params) }

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// CreateBackend instantiates a NIXL plugin. Nil or empty params mean the
// plugin's defaults.
func (a *Agent) CreateBackend(plugin string, params map[string]string) (transfer.Backend, error) {
	plugins, err := a.Plugins()
	if err != nil {
		return nil, err
	}
	if !slices.Contains(plugins, plugin) {
		return nil, a.errorf("create backend", "", transfer.ErrNotSupported, "plugin %q (available: %s)", plugin, strings.Join(plugins, ", "))
	}
	if err := a.enter("create backend"); err != nil {
		return nil, err
	}
	defer a.leave()
	var kvs []byte
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(params[k], 0) >= 0 {
			return nil, a.errorf("create backend", "", transfer.ErrInvalidParam, "parameter %q contains a NUL byte", k)
		}
		kvs = append(append(append(append(kvs, k...), 0), params[k]...), 0)
	}
	kvs = append(kvs, 0)
	cplugin := C.CString(plugin)
	defer C.free(unsafe.Pointer(cplugin))
	ckvs := C.CBytes(kvs)
	defer C.free(ckvs)
	b := &backend{a: a, plugin: plugin}
	if st := C.kv_create_backend(a.lib, a.h, cplugin, (*C.char)(ckvs), C.size_t(len(keys)), &b.h); st != C.KV_CAPI_SUCCESS {
		return nil, a.fail("create backend "+plugin, "", st, transfer.ErrBackend, transfer.ErrNotSupported)
	}
	var buf C.kv_buf
	var mask C.uint32_t
	st := C.kv_backend_params(a.lib, a.h, b.h, &buf, &mask)
	recs, ok := splitRecords(takeBuf(&buf))
	if st == C.KV_CAPI_SUCCESS && ok {
		b.params = make(map[string]string, len(recs)/2)
		for i := 0; i+1 < len(recs); i += 2 {
			b.params[string(recs[i])] = string(recs[i+1])
		}
		for k := transfer.DRAM; k.Valid(); k++ {
			if mask&(1<<k) != 0 {
				b.mems = append(b.mems, k)
			}
		}
	} else {
		a.log.Warn("backend parameters unavailable", "plugin", plugin, "status", int(st))
	}
	a.state.Lock()
	a.backends = append(a.backends, b)
	a.state.Unlock()
	return b, nil
}

// Backends returns the backends created so far.
func (a *Agent) Backends() []transfer.Backend {
	a.state.Lock()
	defer a.state.Unlock()
	out := make([]transfer.Backend, len(a.backends))
	for i, b := range a.backends {
		out[i] = b
	}
	return out
}

// flatten returns descriptors as (addr, len, dev) triples for C.
func flatten(ds []transfer.Desc) []C.uint64_t {
	out := make([]C.uint64_t, 0, 3*len(ds))
	for _, d := range ds {
		out = append(out, C.uint64_t(d.Addr), C.uint64_t(d.Len), C.uint64_t(d.DevID))
	}
	return out
}

func firstOrNil(s []C.uint64_t) *C.uint64_t {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}

func checkDescs(ds []transfer.Desc) int {
	for i, d := range ds {
		if _, ok := d.End(); !ok || d.Len == 0 {
			return i
		}
	}
	return -1
}

// RegisterMem registers memory with every backend that supports its kind.
func (a *Agent) RegisterMem(l transfer.RegList) error {
	return a.register("register", true, l)
}

// DeregisterMem deregisters memory registered with exactly these
// descriptors. A list naming one range twice is refused with
// transfer.ErrInvalidParam, also when it was registered twice. While a posted request using the memory has not finished it
// returns transfer.ErrInProgress and keeps the memory registered: wait for
// the request or release it first.
func (a *Agent) DeregisterMem(l transfer.RegList) error {
	return a.register("deregister", false, l)
}

// compareDescs orders descriptors by device, address and length.
func compareDescs(a, b transfer.Desc) int {
	return cmp.Or(cmp.Compare(a.DevID, b.DevID), cmp.Compare(a.Addr, b.Addr), cmp.Compare(a.Len, b.Len))
}

func (a *Agent) register(op string, reg bool, l transfer.RegList) error {
	descs := make([]transfer.Desc, len(l.Descs))
	var meta []byte
	lens := make([]C.uint64_t, len(l.Descs))
	for i, d := range l.Descs {
		descs[i] = d.Desc
		meta = append(meta, d.Meta...)
		lens[i] = C.uint64_t(len(d.Meta))
	}
	if !l.Kind.Valid() || len(descs) == 0 || checkDescs(descs) >= 0 {
		return a.errorf(op, "", transfer.ErrInvalidParam, "%s list of %d descriptors", l.Kind, len(descs))
	}
	if !reg {
		// NIXL would remove one registration twice and crash.
		sorted := slices.SortedFunc(slices.Values(descs), compareDescs)
		for i := 1; i < len(sorted); i++ {
			if sorted[i] == sorted[i-1] {
				return a.errorf(op, "", transfer.ErrInvalidParam, "%#x+%d named twice; deregister each registration of it in a call of its own", sorted[i].Addr, sorted[i].Len)
			}
		}
	}
	if err := a.enter(op); err != nil {
		return err
	}
	defer a.leave()
	var removed []region
	if !reg {
		var err error
		if removed, err = a.takeRegions(op, l.Kind, descs); err != nil {
			return err
		}
	}
	flat := flatten(descs)
	var cmeta unsafe.Pointer
	if len(meta) > 0 {
		cmeta = C.CBytes(meta)
		defer C.free(cmeta)
	}
	a.state.Lock()
	defer a.state.Unlock()
	if st := C.kv_register(a.lib, a.h, C.bool(reg), C.kv_mem(l.Kind), &flat[0], C.size_t(len(descs)), (*C.char)(cmeta), &lens[0]); st != C.KV_CAPI_SUCCESS {
		a.regions = append(a.regions, removed...)
		return a.fail(op, "", st, transfer.ErrBackend, transfer.ErrNotSupported)
	}
	if reg {
		for i, d := range descs {
			a.regionSeq++
			a.regions = append(a.regions, region{kind: l.Kind, desc: d, meta: slices.Clone(l.Descs[i].Meta), id: a.regionSeq})
		}
	}
	return nil
}

// takeRegions takes the registrations of exactly descs out of a.regions,
// so that no request or list using them is posted or made any more, and
// returns them for NIXL to deregister. While a posted request using one
// has not finished, it puts them back and returns ErrInProgress: NIXL
// would free the registration under the running transfer, and the caller
// the memory it still lands in. The caller holds a.mu for reading and not
// a.state.
func (a *Agent) takeRegions(op string, kind transfer.MemKind, descs []transfer.Desc) ([]region, error) {
	a.state.Lock()
	var removed []region
	for _, d := range descs {
		i := a.regionIndex(kind, d)
		if i < 0 {
			a.regions = append(a.regions, removed...)
			a.state.Unlock()
			return nil, a.errorf(op, "", transfer.ErrNotRegistered, "%#x+%d was not registered", d.Addr, d.Len)
		}
		removed = append(removed, a.regions[i])
		a.regions = slices.Delete(a.regions, i, i+1)
	}
	a.deregs++
	var users []*request
	for h := range a.handles {
		if r, ok := h.(*request); ok && slices.ContainsFunc(removed, func(g region) bool { return slices.Contains(r.regs, g.id) }) {
			users = append(users, r)
		}
	}
	a.state.Unlock()
	for _, r := range users {
		if r.running() {
			a.state.Lock()
			a.regions = append(a.regions, removed...)
			a.state.Unlock()
			return nil, a.errorf(op, r.remote, transfer.ErrInProgress, "a posted request using the memory has not finished; wait for it or release it first")
		}
	}
	return removed, nil
}

// LocalMetadata returns NIXL's metadata blob of this agent.
func (a *Agent) LocalMetadata() ([]byte, error) {
	if err := a.enter("local metadata"); err != nil {
		return nil, err
	}
	defer a.leave()
	var data unsafe.Pointer
	var n C.size_t
	if st := C.cgoGetLocalMD(a.lib, a.h, &data, &n); st != C.KV_CAPI_SUCCESS {
		return nil, a.fail("local metadata", "", st, transfer.ErrBackend, transfer.ErrBackend)
	}
	defer C.free(data)
	return C.GoBytes(data, C.int(n)), nil
}

// LoadRemoteMetadata loads a remote agent's NIXL metadata.
func (a *Agent) LoadRemoteMetadata(md []byte) (string, error) {
	if len(md) == 0 {
		return "", a.errorf("load metadata", "", transfer.ErrBadMetadata, "empty")
	}
	if err := a.enter("load metadata"); err != nil {
		return "", err
	}
	defer a.leave()
	cmd := C.CBytes(md)
	defer C.free(cmd)
	var name *C.char
	if st := C.cgoLoadRemoteMD(a.lib, a.h, cmd, C.size_t(len(md)), &name); st != C.KV_CAPI_SUCCESS {
		if st == C.KV_CAPI_ERROR_INVALID_PARAM {
			// NIXL refuses the agent's own metadata so: an invalid
			// argument, and metadata of no remote agent.
			return "", &transfer.Error{Op: "load metadata", Agent: a.name, Code: int(st),
				Err: fmt.Errorf("%w: %w (such as this agent's own)", transfer.ErrInvalidParam, transfer.ErrBadMetadata)}
		}
		return "", a.fail("load metadata", "", st, transfer.ErrBadMetadata, transfer.ErrBadMetadata)
	}
	defer C.free(unsafe.Pointer(name))
	s := C.GoString(name)
	a.state.Lock()
	a.remotes[s] = true
	a.state.Unlock()
	return s, nil
}

// InvalidateRemoteMetadata forgets a remote agent.
func (a *Agent) InvalidateRemoteMetadata(remote string) error {
	if err := a.enter("invalidate metadata"); err != nil {
		return err
	}
	defer a.leave()
	a.state.Lock()
	defer a.state.Unlock()
	if !a.remotes[remote] {
		return a.errorf("invalidate metadata", remote, transfer.ErrUnknownAgent, "")
	}
	cr := C.CString(remote)
	defer C.free(unsafe.Pointer(cr))
	if st := C.cgoInvalidateRemoteMD(a.lib, a.h, cr); st != C.KV_CAPI_SUCCESS {
		return a.fail("invalidate metadata", remote, st, transfer.ErrBackend, transfer.ErrUnknownAgent)
	}
	delete(a.remotes, remote)
	return nil
}

// checkList validates a list locally: well-formed descriptors, registered
// local memory, a known remote agent. NIXL checks remote memory itself.
// For a local list it returns the ids of the regions holding it, sorted
// and distinct, and the deregistration generation they were found in.
// The caller holds a.mu for reading (see enter).
func (a *Agent) checkList(op, remote string, l transfer.DescList) ([]uint64, uint64, error) {
	if !l.Kind.Valid() || len(l.Descs) == 0 {
		return nil, 0, a.errorf(op, remote, transfer.ErrInvalidParam, "%s list of %d descriptors", l.Kind, len(l.Descs))
	}
	if i := checkDescs(l.Descs); i >= 0 {
		return nil, 0, a.errorf(op, remote, transfer.ErrInvalidParam, "descriptor %d: %#x+%d", i, l.Descs[i].Addr, l.Descs[i].Len)
	}
	a.state.Lock()
	defer a.state.Unlock()
	if remote != "" {
		if !a.remotes[remote] {
			return nil, 0, a.errorf(op, remote, transfer.ErrUnknownAgent, "")
		}
		return nil, 0, nil
	}
	var regs []uint64
	for i, d := range l.Descs {
		j := slices.IndexFunc(a.regions, func(r region) bool { return r.kind == l.Kind && r.desc.Covers(d) })
		if j < 0 {
			return nil, 0, a.errorf(op, "", transfer.ErrNotRegistered, "local descriptor %d: %#x+%d dev %d", i, d.Addr, d.Len, d.DevID)
		}
		if id := a.regions[j].id; len(regs) == 0 || regs[len(regs)-1] != id {
			regs = append(regs, id)
		}
	}
	slices.Sort(regs)
	return slices.Compact(regs), a.deregs, nil
}

// prepped is a prepared descriptor list (nixlDlistH).
type prepped struct {
	a      *Agent
	remote string
	lens   []uint64
	// regs are the ids of the regions a local list lies in.
	regs []uint64

	mu       sync.Mutex // protects the fields below
	h        C.kv_dlist_handle
	released bool
	// gen is the deregistration generation regs were last checked in.
	gen uint64
}

// Remote returns the remote agent, "" for a local list.
func (p *prepped) Remote() string { return p.remote }

// Len returns the number of descriptors.
func (p *prepped) Len() int { return len(p.lens) }

// Release releases the prepared list.
func (p *prepped) Release() error { return p.a.releaseHandle("release list", p) }

// release frees the handle. The caller holds a.mu.
func (p *prepped) release() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return p.a.errorf("release list", p.remote, transfer.ErrReleased, "")
	}
	if st := C.cgoReleaseDlist(p.a.lib, p.a.h, p.h); st != C.KV_CAPI_SUCCESS {
		return p.a.fail("release list", p.remote, st, transfer.ErrBackend, transfer.ErrBackend)
	}
	p.released = true
	return nil
}

// PrepDescList prepares a local (remote "") or remote descriptor list, in
// one call into NIXL however long the list.
func (a *Agent) PrepDescList(remote string, l transfer.DescList) (transfer.PreppedList, error) {
	const op = "prepare list"
	// Entered first: Close forgets the registrations.
	if err := a.enter(op); err != nil {
		return nil, err
	}
	defer a.leave()
	regs, gen, err := a.checkList(op, remote, l)
	if err != nil {
		return nil, err
	}
	flat := flatten(l.Descs)
	cr := C.CString(remote)
	defer C.free(unsafe.Pointer(cr))
	p := &prepped{a: a, remote: remote, lens: make([]uint64, len(l.Descs)), regs: regs, gen: gen}
	for i, d := range l.Descs {
		p.lens[i] = d.Len
	}
	if st := C.kv_prep(a.lib, a.h, cr, C.kv_mem(l.Kind), &flat[0], C.size_t(len(l.Descs)), &p.h); st != C.KV_CAPI_SUCCESS {
		// Local memory and the agent were checked: NIXL refuses the
		// remote descriptors.
		return nil, a.fail(op, remote, st, transfer.ErrNotRegistered, transfer.ErrNotRegistered)
	}
	a.track(p)
	return p, nil
}

// opts builds NIXL optional arguments for a request.
func (a *Agent) opts(o *transfer.RequestOptions) (C.kv_opt_args, error) {
	var notif []byte
	has, skip := false, false
	var bs []C.kv_backend
	if o != nil {
		notif, has, skip = o.Notif, o.Notif != nil, o.SkipDescMerge
		for _, b := range o.Backends {
			nb, ok := b.(*backend)
			if !ok {
				return nil, a.errorf("request options", "", transfer.ErrInvalidParam, "backend %s is not a NIXL backend", b.Plugin())
			}
			if nb.a != a {
				// Its handle belongs to another agent and is freed by
				// that agent's Close.
				return nil, a.errorf("request options", "", transfer.ErrInvalidParam, "backend %s was created by agent %q", b.Plugin(), nb.a.name)
			}
			bs = append(bs, nb.h)
		}
	}
	var cnotif unsafe.Pointer
	if len(notif) > 0 {
		cnotif = C.CBytes(notif)
		defer C.free(cnotif)
	}
	var cbs *C.kv_backend
	if len(bs) > 0 {
		cbs = (*C.kv_backend)(C.malloc(C.size_t(len(bs)) * C.size_t(unsafe.Sizeof(bs[0]))))
		defer C.free(unsafe.Pointer(cbs))
		copy(unsafe.Slice(cbs, len(bs)), bs)
	}
	var out C.kv_opt_args
	if st := C.kv_opts(a.lib, cnotif, C.size_t(len(notif)), C.bool(has), C.bool(skip), cbs, C.size_t(len(bs)), &out); st != C.KV_CAPI_SUCCESS {
		return nil, a.fail("request options", "", st, transfer.ErrBackend, transfer.ErrBackend)
	}
	return out, nil
}

// MakeRequest builds a request from indices into two prepared lists.
func (a *Agent) MakeRequest(op transfer.Op, local transfer.PreppedList, localIdx []int, remote transfer.PreppedList, remoteIdx []int, o *transfer.RequestOptions) (transfer.Request, error) {
	const name = "make request"
	lp, ok1 := local.(*prepped)
	rp, ok2 := remote.(*prepped)
	if !ok1 || !ok2 || lp.a != a || rp.a != a || lp.remote != "" || rp.remote == "" {
		return nil, a.errorf(name, "", transfer.ErrInvalidParam, "want a local and a remote list prepared by this agent")
	}
	if !op.Valid() {
		return nil, a.errorf(name, rp.remote, transfer.ErrInvalidParam, "operation %d", op)
	}
	if err := transfer.CheckIndices(localIdx, remoteIdx, len(lp.lens), len(rp.lens)); err != nil {
		return nil, a.errorf(name, rp.remote, err, "")
	}
	li := make([]C.int, len(localIdx))
	ri := make([]C.int, len(remoteIdx))
	for i := range localIdx {
		l, r := localIdx[i], remoteIdx[i]
		if lp.lens[l] != rp.lens[r] {
			return nil, a.errorf(name, rp.remote, transfer.ErrInvalidParam, "pair %d: %d local bytes, %d remote bytes", i, lp.lens[l], rp.lens[r])
		}
		li[i], ri[i] = C.int(l), C.int(r)
	}
	if err := a.enter(name); err != nil {
		return nil, err
	}
	defer a.leave()
	lp.mu.Lock()
	defer lp.mu.Unlock()
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if lp.released || rp.released {
		return nil, a.errorf(name, rp.remote, transfer.ErrReleased, "prepared list")
	}
	if err := a.registered(name, rp.remote, lp.regs, &lp.gen); err != nil {
		return nil, err
	}
	opt, err := a.opts(o)
	if err != nil {
		return nil, err
	}
	r := &request{a: a, remote: rp.remote, opt: opt, regs: lp.regs, gen: lp.gen}
	if st := C.cgoMakeReq(a.lib, a.h, C.kv_op(op), lp.h, &li[0], C.size_t(len(li)), rp.h, &ri[0], C.size_t(len(ri)), &r.h, opt); st != C.KV_CAPI_SUCCESS {
		C.cgoDestroyOpt(a.lib, opt)
		return nil, a.fail(name, rp.remote, st, transfer.ErrBackend, transfer.ErrUnknownAgent)
	}
	a.track(r)
	return r, nil
}

// CreateRequest builds a request from two descriptor lists.
func (a *Agent) CreateRequest(op transfer.Op, local, remote transfer.DescList, remoteAgent string, o *transfer.RequestOptions) (transfer.Request, error) {
	const name = "create request"
	if remoteAgent == "" || !op.Valid() || len(local.Descs) != len(remote.Descs) {
		return nil, a.errorf(name, remoteAgent, transfer.ErrInvalidParam, "%s of %d local and %d remote descriptors to %q", op, len(local.Descs), len(remote.Descs), remoteAgent)
	}
	// Entered first: Close forgets the registrations.
	if err := a.enter(name); err != nil {
		return nil, err
	}
	defer a.leave()
	regs, gen, err := a.checkList(name, "", local)
	if err != nil {
		return nil, err
	}
	if _, _, err := a.checkList(name, remoteAgent, remote); err != nil {
		return nil, err
	}
	for i := range local.Descs {
		if local.Descs[i].Len != remote.Descs[i].Len {
			return nil, a.errorf(name, remoteAgent, transfer.ErrInvalidParam, "pair %d: %d local bytes, %d remote bytes", i, local.Descs[i].Len, remote.Descs[i].Len)
		}
	}
	opt, err := a.opts(o)
	if err != nil {
		return nil, err
	}
	lf, rf := flatten(local.Descs), flatten(remote.Descs)
	cr := C.CString(remoteAgent)
	defer C.free(unsafe.Pointer(cr))
	r := &request{a: a, remote: remoteAgent, opt: opt, regs: regs, gen: gen}
	if st := C.kv_create_req(a.lib, a.h, C.kv_op(op), C.kv_mem(local.Kind), &lf[0], C.kv_mem(remote.Kind), &rf[0], C.size_t(len(local.Descs)), cr, opt, &r.h); st != C.KV_CAPI_SUCCESS {
		C.cgoDestroyOpt(a.lib, opt)
		// Local memory and the agent were checked; the C API reports the
		// remaining refusal, remote memory outside the metadata, as a
		// backend error.
		return nil, a.fail(name, remoteAgent, st, transfer.ErrNotRegistered, transfer.ErrNotRegistered)
	}
	a.track(r)
	return r, nil
}

// handle is a native handle the agent releases on Close.
type handle interface {
	// release frees the native handle. The caller holds a.mu.
	release() error
}

// track records a live handle.
func (a *Agent) track(h handle) {
	a.state.Lock()
	a.handles[h] = struct{}{}
	a.state.Unlock()
}

// releaseHandle releases a handle for its Release method.
func (a *Agent) releaseHandle(op string, h handle) error {
	if err := a.enter(op); err != nil {
		return err
	}
	defer a.leave()
	if err := h.release(); err != nil {
		return err
	}
	a.state.Lock()
	delete(a.handles, h)
	a.state.Unlock()
	return nil
}

// SendNotif sends a standalone notification.
func (a *Agent) SendNotif(remote string, msg []byte) error {
	const op = "send notification"
	if err := a.enter(op); err != nil {
		return err
	}
	defer a.leave()
	a.state.Lock()
	known := a.remotes[remote]
	a.state.Unlock()
	if !known {
		return a.errorf(op, remote, transfer.ErrUnknownAgent, "")
	}
	cr := C.CString(remote)
	defer C.free(unsafe.Pointer(cr))
	var cmsg unsafe.Pointer
	if len(msg) > 0 {
		cmsg = C.CBytes(msg)
		defer C.free(cmsg)
	}
	if st := C.cgoGenNotif(a.lib, a.h, cr, cmsg, C.size_t(len(msg))); st != C.KV_CAPI_SUCCESS {
		return a.fail(op, remote, st, transfer.ErrRemoteDisconnect, transfer.ErrUnknownAgent)
	}
	return nil
}

// Notifs returns and forgets the notifications NIXL received.
func (a *Agent) Notifs() ([]transfer.Notif, error) {
	if err := a.enter("notifications"); err != nil {
		return nil, err
	}
	defer a.leave()
	a.notifMu.Lock()
	defer a.notifMu.Unlock()
	var buf C.kv_buf
	st := C.kv_take_notifs(a.lib, a.h, a.nmap, &buf)
	recs, ok := splitRecords(takeBuf(&buf))
	if st != C.KV_CAPI_SUCCESS || !ok || len(recs)%2 != 0 {
		return nil, a.fail("notifications", "", st, transfer.ErrBackend, transfer.ErrBackend)
	}
	out := make([]transfer.Notif, 0, len(recs)/2)
	for i := 0; i < len(recs); i += 2 {
		out = append(out, transfer.Notif{From: string(recs[i]), Msg: slices.Clone(recs[i+1])})
	}
	return out, nil
}

// Close releases every live handle, deregisters the memory still
// registered, destroys the backends and then the NIXL agent, in the order
// NIXL requires: memory goes before the backends it is registered with. It
// carries on past a failed step and returns every failure. A second Close
// returns transfer.ErrClosed.
func (a *Agent) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return a.errorf("close", "", transfer.ErrClosed, "")
	}
	a.closed = true
	a.state.Lock()
	defer a.state.Unlock()
	for h := range a.handles {
		if err := h.release(); err != nil {
			a.log.Warn("release handle on close", "err", err)
		}
	}
	a.handles = nil
	errs := []error{a.deregisterAll()}
	for _, b := range a.backends {
		if st := C.cgoDestroyBackend(a.lib, b.h); st != C.KV_CAPI_SUCCESS {
			errs = append(errs, a.fail("close: destroy backend "+b.plugin, "", st, transfer.ErrBackend, transfer.ErrBackend))
		}
		b.h = nil
	}
	C.cgoDestroyNotifMap(a.lib, a.nmap)
	if st := C.cgoDestroyAgent(a.lib, a.h); st != C.KV_CAPI_SUCCESS {
		errs = append(errs, a.fail("close", "", st, transfer.ErrBackend, transfer.ErrBackend))
	}
	C.free(unsafe.Pointer(a.lib))
	return errors.Join(errs...)
}

// deregisterAll deregisters every registered region, for Close. It
// deregisters one region per NIXL call, the last registered first: a list
// naming a range registered twice would have NIXL remove one registration
// twice. The caller holds a.mu for writing and a.state.
func (a *Agent) deregisterAll() error {
	var errs []error
	for _, g := range slices.Backward(a.regions) {
		flat := flatten([]transfer.Desc{g.desc})
		lens := []C.uint64_t{C.uint64_t(len(g.meta))}
		var cmeta unsafe.Pointer
		if len(g.meta) > 0 {
			cmeta = C.CBytes(g.meta)
		}
		st := C.kv_register(a.lib, a.h, false, C.kv_mem(g.kind), &flat[0], 1, (*C.char)(cmeta), &lens[0])
		C.free(cmeta)
		if st != C.KV_CAPI_SUCCESS {
			errs = append(errs, a.fail(fmt.Sprintf("close: deregister %s %#x+%d", g.kind, g.desc.Addr, g.desc.Len), "", st, transfer.ErrBackend, transfer.ErrBackend))
		}
	}
	a.regions = nil
	return errors.Join(errs...)
}

// request is a NIXL transfer request (nixlXferReqH).
type request struct {
	a      *Agent
	remote string
	h      C.kv_xfer_req
	opt    C.kv_opt_args
	// regs are the ids of the regions its local memory lies in.
	regs []uint64

	mu       sync.Mutex // protects the fields below
	state    transfer.Status
	err      error
	released bool
	// gen is the deregistration generation regs were last checked in.
	gen uint64
}

// Post posts the request.
func (r *request) Post() (transfer.Status, error) {
	if err := r.a.enter("post"); err != nil {
		return transfer.StatusIdle, err
	}
	defer r.a.leave()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return r.state, r.a.errorf("post", r.remote, transfer.ErrReleased, "")
	}
	if r.state == transfer.StatusInProgress {
		if r.poll(); r.state == transfer.StatusInProgress {
			return r.state, r.a.errorf("post", r.remote, transfer.ErrInProgress, "")
		}
	}
	if err := r.a.registered("post", r.remote, r.regs, &r.gen); err != nil {
		return r.state, err
	}
	st := C.cgoPost(r.a.lib, r.a.h, r.h, r.opt)
	r.set(st, "post")
	return r.state, r.err
}

// set records a NIXL status. The caller holds mu.
func (r *request) set(st C.kv_status, op string) {
	switch st {
	case C.KV_CAPI_SUCCESS:
		r.state, r.err = transfer.StatusDone, nil
	case C.KV_CAPI_IN_PROG:
		r.state, r.err = transfer.StatusInProgress, nil
	default:
		r.state, r.err = transfer.StatusFailed, r.a.fail(op, r.remote, st, transfer.ErrRemoteDisconnect, transfer.ErrUnknownAgent)
	}
}

// running polls the request and reports whether it is posted and not
// finished. The caller holds a.mu for reading.
func (r *request) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return false
	}
	r.poll()
	return r.state == transfer.StatusInProgress
}

// poll refreshes a running request's state. The caller holds mu and a.mu.
func (r *request) poll() {
	if r.state == transfer.StatusInProgress {
		r.set(C.cgoStatus(r.a.lib, r.a.h, r.h), "status")
	}
}

// Status polls the request.
func (r *request) Status() (transfer.Status, error) {
	if err := r.a.enter("status"); err != nil {
		return transfer.StatusIdle, err
	}
	defer r.a.leave()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return r.state, r.a.errorf("status", r.remote, transfer.ErrReleased, "")
	}
	r.poll()
	return r.state, r.err
}

// Wait polls with backoff until the transfer finishes or ctx ends.
func (r *request) Wait(ctx context.Context) error {
	r.mu.Lock()
	idle := r.state == transfer.StatusIdle && !r.released
	r.mu.Unlock()
	if idle {
		return r.a.errorf("wait", r.remote, transfer.ErrInvalidParam, "request not posted")
	}
	err := poll.Until(ctx, func() (bool, error) {
		st, err := r.Status()
		return st == transfer.StatusDone, err
	})
	if err != nil && ctx.Err() != nil && err == ctx.Err() {
		return r.a.errorf("wait", r.remote, err, "")
	}
	return err
}

// Release releases the request; NIXL aborts it if it is still running.
func (r *request) Release() error { return r.a.releaseHandle("release", r) }

// release frees the handle. The caller holds a.mu.
func (r *request) release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return r.a.errorf("release", r.remote, transfer.ErrReleased, "")
	}
	if st := C.kv_release_req(r.a.lib, r.a.h, r.h); st != C.KV_CAPI_SUCCESS {
		return r.a.fail("release", r.remote, st, transfer.ErrBackend, transfer.ErrBackend)
	}
	C.cgoDestroyOpt(r.a.lib, r.opt)
	r.released = true
	return nil
}
