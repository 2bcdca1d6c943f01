package tcp

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/transfer"
)

// PluginName is the name of this backend's only plugin.
const PluginName = "TCP"

// Config configures an Agent. Only Name is required.
type Config struct {
	// Name is the agent's name, unique among the agents that talk to each
	// other; at most 4096 bytes.
	Name string
	// ListenAddr is the address to accept peers on. Zero means
	// "127.0.0.1:0" (loopback, any free port); production hosts give the
	// interface the decode workers can reach.
	ListenAddr string
	// AdvertiseAddr is the address written into the metadata for peers to
	// dial, at most 4096 bytes. Zero means the listener's address.
	AdvertiseAddr string
	// DialTimeout bounds connecting to a peer. Zero means 5 s; negative
	// bounds here are refused.
	DialTimeout time.Duration
	// IOTimeout bounds how long a frame may stall half-way (no byte read,
	// or less than 256 KiB written, for that long) before the connection is
	// declared dead. A frame may take longer in all while its bytes keep
	// moving. Zero means 30 s.
	IOTimeout time.Duration
	// MaxQueuedNotifs bounds received notifications not yet taken with
	// Notifs; past it the oldest are dropped (and logged). Zero means 65536.
	MaxQueuedNotifs int
	// Logger receives connection errors and dropped notifications. Nil
	// means discard.
	Logger *slog.Logger
}

// Agent is a transfer.Agent that moves registered host memory over TCP.
//
// Each agent listens on one address. An initiator opens one connection per
// remote agent on first use and sends its requests over it in order; the
// target validates every descriptor against its registered memory before a
// byte moves, so a peer can never read or write outside what was
// registered. Connections are not authenticated: run agents on a network
// that only trusted peers reach, as with NIXL's UCX backend.
//
// All methods are safe for concurrent use.
type Agent struct {
	cfg Config
	log *slog.Logger
	ln  net.Listener
	md  string // the advertised address
	// incarnation, drawn at random by New, tells this agent from an
	// earlier or later one of the same name and address: a hello naming
	// another incarnation was meant for an agent that is gone.
	incarnation uint64
	regs        registry
	nextID      atomic.Uint64
	wg          sync.WaitGroup // tracks every goroutine the agent started

	mu sync.Mutex // protects the fields below
	// closed is set by Close; every method checks it.
	closed bool
	// remotes maps a loaded agent name to its metadata and connection.
	remotes map[string]*remote
	// served holds accepted connections, to close them on Close.
	served map[net.Conn]struct{}
	// notifs[notifHead:] are the received notifications Notifs has not
	// taken; the entries before notifHead were dropped when the queue was
	// full, and are cleared.
	notifs    []transfer.Notif
	notifHead int
	// notifsDropped counts the notifications dropped since Notifs last
	// took the queue.
	notifsDropped int
	// backends holds the backends created so far.
	backends []transfer.Backend
}

// remote is a loaded remote agent.
type remote struct {
	md   *metadata
	conn *peerConn // nil until first use or after a failure
}

// New starts an agent listening on cfg.ListenAddr, with the TCP backend
// created. Errors: transfer.ErrInvalidParam for a missing or too long
// name, an AdvertiseAddr longer than 4096 bytes or a negative bound, or
// the listener's error.
func New(cfg Config) (*Agent, error) {
	if cfg.Name == "" || len(cfg.Name) > maxNameLen {
		return nil, fmt.Errorf("%w: agent name %q", transfer.ErrInvalidParam, cfg.Name)
	}
	if len(cfg.AdvertiseAddr) > maxNameLen {
		return nil, fmt.Errorf("%w: advertised address of %d bytes (max %d)", transfer.ErrInvalidParam, len(cfg.AdvertiseAddr), maxNameLen)
	}
	if cfg.DialTimeout < 0 || cfg.IOTimeout < 0 || cfg.MaxQueuedNotifs < 0 {
		return nil, fmt.Errorf("%w: negative DialTimeout %v, IOTimeout %v or MaxQueuedNotifs %d",
			transfer.ErrInvalidParam, cfg.DialTimeout, cfg.IOTimeout, cfg.MaxQueuedNotifs)
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.IOTimeout == 0 {
		cfg.IOTimeout = 30 * time.Second
	}
	if cfg.MaxQueuedNotifs == 0 {
		cfg.MaxQueuedNotifs = 1 << 16
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("tcp: agent %s: listen: %w", cfg.Name, err)
	}
	a := &Agent{
		cfg: cfg,
		log: log.With("agent", cfg.Name),
		ln:  ln,
		md:  cfg.AdvertiseAddr,
		// Not secret, only distinct: the runtime seeds math/rand/v2
		// from the operating system's randomness.
		incarnation: rand.Uint64(),
		remotes:     make(map[string]*remote),
		served:      make(map[net.Conn]struct{}),
	}
	if a.md == "" {
		a.md = ln.Addr().String()
	}
	a.backends = []transfer.Backend{backend{}}
	a.wg.Add(1)
	go a.accept()
	return a, nil
}

var _ transfer.Agent = (*Agent)(nil)

// Name returns the agent's name.
func (a *Agent) Name() string { return a.cfg.Name }

// Addr returns the address the agent listens on.
func (a *Agent) Addr() net.Addr { return a.ln.Addr() }

func (a *Agent) errorf(op, remote string, err error, format string, args ...any) error {
	return transfer.Errorf(a.cfg.Name, op, remote, err, format, args...)
}

// checkOpen returns ErrClosed after Close. The caller holds a.mu.
func (a *Agent) checkOpen(op string) error {
	if a.closed {
		return a.errorf(op, "", transfer.ErrClosed, "")
	}
	return nil
}

// backend is the TCP backend.
type backend struct{}

// Plugin returns "TCP".
func (backend) Plugin() string { return PluginName }

// MemKinds returns DRAM, the only kind the backend moves.
func (backend) MemKinds() []transfer.MemKind { return []transfer.MemKind{transfer.DRAM} }

// Params returns no parameters: the backend has none.
func (backend) Params() map[string]string { return map[string]string{} }

// Plugins returns ["TCP"].
func (a *Agent) Plugins() ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkOpen("plugins"); err != nil {
		return nil, err
	}
	return []string{PluginName}, nil
}

// CreateBackend returns the TCP backend for plugin "TCP" and
// ErrNotSupported for any other.
func (a *Agent) CreateBackend(plugin string, _ map[string]string) (transfer.Backend, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkOpen("create backend"); err != nil {
		return nil, err
	}
	if plugin != PluginName {
		return nil, a.errorf("create backend", "", transfer.ErrNotSupported, "plugin %q (only %q)", plugin, PluginName)
	}
	return a.backends[0], nil
}

// Backends returns the TCP backend.
func (a *Agent) Backends() []transfer.Backend {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]transfer.Backend(nil), a.backends...)
}

// checkRegList validates a registration list.
func (a *Agent) checkRegList(op string, l transfer.RegList) error {
	if l.Kind != transfer.DRAM {
		return a.errorf(op, "", transfer.ErrNotSupported, "memory kind %s (TCP moves DRAM only)", l.Kind)
	}
	if len(l.Descs) == 0 {
		return a.errorf(op, "", transfer.ErrInvalidParam, "empty list")
	}
	for _, d := range l.Descs {
		if _, ok := d.End(); !ok || d.Len == 0 || d.Addr == 0 {
			return a.errorf(op, "", transfer.ErrInvalidParam, "descriptor %#x+%d", d.Addr, d.Len)
		}
	}
	return nil
}

// RegisterMem registers host memory (DRAM only).
func (a *Agent) RegisterMem(l transfer.RegList) error {
	if err := a.checkRegList("register", l); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkOpen("register"); err != nil {
		return err
	}
	a.regs.add(l.Kind, l.Descs)
	return nil
}

// DeregisterMem removes a registration. No transfer starts using the
// memory afterwards; DeregisterMem waits for the transfers copying into or
// out of it to finish copying, and for no other, also when it returns
// ErrClosed.
func (a *Agent) DeregisterMem(l transfer.RegList) error {
	if err := a.checkRegList("deregister", l); err != nil {
		return err
	}
	a.mu.Lock()
	err := a.checkOpen("deregister")
	a.mu.Unlock()
	// Without a.mu: the agent keeps working while transfers using the
	// memory finish. On a closed agent too, since copies may run until
	// Close has shut their connections.
	found := a.regs.remove(l.Kind, l.Descs)
	if err != nil {
		return err
	}
	if !found {
		return a.errorf("deregister", "", transfer.ErrNotRegistered, "no registration matches")
	}
	return nil
}

// LocalMetadata returns the agent's name, address and registered regions.
func (a *Agent) LocalMetadata() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkOpen("local metadata"); err != nil {
		return nil, err
	}
	m := metadata{name: a.cfg.Name, addr: a.md, incarnation: a.incarnation, regions: a.regs.snapshot()}
	return m.marshal(), nil
}

// LoadRemoteMetadata loads a remote agent's metadata. Reloading an agent
// keeps its connection when the agent neither moved nor restarted; else
// the requests running on the old connection fail with
// ErrRemoteDisconnect. The agent's own metadata is refused with an error
// wrapping both ErrInvalidParam and ErrBadMetadata.
func (a *Agent) LoadRemoteMetadata(md []byte) (string, error) {
	m, err := unmarshalMetadata(md)
	if err != nil {
		return "", a.errorf("load metadata", "", err, "")
	}
	if m.name == a.cfg.Name {
		return "", a.errorf("load metadata", "", fmt.Errorf("%w: %w", transfer.ErrInvalidParam, transfer.ErrBadMetadata), "metadata of agent %q itself", m.name)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkOpen("load metadata"); err != nil {
		return "", err
	}
	if old := a.remotes[m.name]; old != nil {
		if old.md.addr == m.addr && old.md.incarnation == m.incarnation {
			old.md = m
			return m.name, nil
		}
		if old.conn != nil {
			old.conn.fail(a.errorf("transfer", m.name, transfer.ErrRemoteDisconnect, "metadata reloaded: the agent moved or restarted"))
		}
	}
	a.remotes[m.name] = &remote{md: m}
	return m.name, nil
}

// InvalidateRemoteMetadata forgets a remote agent and closes its
// connection; its running requests fail with ErrUnknownAgent.
func (a *Agent) InvalidateRemoteMetadata(name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkOpen("invalidate metadata"); err != nil {
		return err
	}
	r := a.remotes[name]
	if r == nil {
		return a.errorf("invalidate metadata", name, transfer.ErrUnknownAgent, "")
	}
	delete(a.remotes, name)
	if r.conn != nil {
		r.conn.fail(a.errorf("transfer", name, transfer.ErrUnknownAgent, "metadata invalidated"))
	}
	return nil
}

// checkList validates a transfer list against local registrations (remote
// "") or a remote agent's metadata. The caller holds a.mu.
func (a *Agent) checkList(op, remoteName string, l transfer.DescList) error {
	if l.Kind != transfer.DRAM {
		return a.errorf(op, remoteName, transfer.ErrNotSupported, "memory kind %s (TCP moves DRAM only)", l.Kind)
	}
	for i, d := range l.Descs {
		if _, ok := d.End(); !ok || d.Len == 0 {
			return a.errorf(op, remoteName, transfer.ErrInvalidParam, "descriptor %d: %#x+%d", i, d.Addr, d.Len)
		}
	}
	var i int
	if remoteName == "" {
		i = a.regs.uncovered(l.Kind, l.Descs)
	} else {
		r := a.remotes[remoteName]
		if r == nil {
			return a.errorf(op, remoteName, transfer.ErrUnknownAgent, "")
		}
		i = r.md.index.firstUncovered(l.Kind, l.Descs)
	}
	if i >= 0 {
		side := "local"
		if remoteName != "" {
			side = "remote"
		}
		d := l.Descs[i]
		return a.errorf(op, remoteName, transfer.ErrNotRegistered, "%s descriptor %d: %#x+%d dev %d", side, i, d.Addr, d.Len, d.DevID)
	}
	return nil
}

// prepped is a prepared descriptor list.
type prepped struct {
	agent    *Agent
	remote   string
	descs    []transfer.Desc
	released atomic.Bool
}

// Remote returns the remote agent, "" for a local list.
func (p *prepped) Remote() string { return p.remote }

// Len returns the number of descriptors.
func (p *prepped) Len() int { return len(p.descs) }

// Release forgets the list; requests made from it keep their descriptors.
func (p *prepped) Release() error {
	if p.released.Swap(true) {
		return p.agent.errorf("release list", p.remote, transfer.ErrReleased, "")
	}
	p.agent.mu.Lock()
	defer p.agent.mu.Unlock()
	return p.agent.checkOpen("release list")
}

// PrepDescList validates and keeps a descriptor list for MakeRequest.
func (a *Agent) PrepDescList(remoteName string, l transfer.DescList) (transfer.PreppedList, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkOpen("prepare list"); err != nil {
		return nil, err
	}
	if err := a.checkList("prepare list", remoteName, l); err != nil {
		return nil, err
	}
	return &prepped{agent: a, remote: remoteName, descs: append([]transfer.Desc(nil), l.Descs...)}, nil
}

// MakeRequest builds a request from indices into two prepared lists.
func (a *Agent) MakeRequest(op transfer.Op, local transfer.PreppedList, localIdx []int, remoteList transfer.PreppedList, remoteIdx []int, opts *transfer.RequestOptions) (transfer.Request, error) {
	const name = "make request"
	lp, ok1 := local.(*prepped)
	rp, ok2 := remoteList.(*prepped)
	if !ok1 || !ok2 || lp.agent != a || rp.agent != a {
		return nil, a.errorf(name, "", transfer.ErrInvalidParam, "lists were not prepared by this agent")
	}
	if lp.remote != "" || rp.remote == "" {
		return nil, a.errorf(name, rp.remote, transfer.ErrInvalidParam, "want a local and a remote list")
	}
	a.mu.Lock()
	err := a.checkOpen(name)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if lp.released.Load() || rp.released.Load() {
		return nil, a.errorf(name, rp.remote, transfer.ErrReleased, "prepared list")
	}
	if err := transfer.CheckIndices(localIdx, remoteIdx, len(lp.descs), len(rp.descs)); err != nil {
		return nil, a.errorf(name, rp.remote, err, "")
	}
	ld := make([]transfer.Desc, len(localIdx))
	rd := make([]transfer.Desc, len(remoteIdx))
	for i := range localIdx {
		ld[i], rd[i] = lp.descs[localIdx[i]], rp.descs[remoteIdx[i]]
	}
	return a.newRequest(name, op, ld, rd, rp.remote, opts)
}

// CreateRequest builds a request from two descriptor lists.
func (a *Agent) CreateRequest(op transfer.Op, local, remoteList transfer.DescList, remoteName string, opts *transfer.RequestOptions) (transfer.Request, error) {
	const name = "create request"
	if remoteName == "" {
		return nil, a.errorf(name, "", transfer.ErrInvalidParam, "no remote agent")
	}
	if len(local.Descs) != len(remoteList.Descs) || len(local.Descs) == 0 {
		return nil, a.errorf(name, remoteName, transfer.ErrInvalidParam, "%d local and %d remote descriptors", len(local.Descs), len(remoteList.Descs))
	}
	a.mu.Lock()
	err := a.checkOpen(name)
	if err == nil {
		err = a.checkList(name, "", local)
	}
	if err == nil {
		err = a.checkList(name, remoteName, remoteList)
	}
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return a.newRequest(name, op, append([]transfer.Desc(nil), local.Descs...), append([]transfer.Desc(nil), remoteList.Descs...), remoteName, opts)
}

// SendNotif queues a standalone notification for a remote agent.
func (a *Agent) SendNotif(remoteName string, msg []byte) error {
	if len(msg) > maxNotifLen {
		return a.errorf("send notification", remoteName, transfer.ErrInvalidParam, "%d bytes (max %d)", len(msg), maxNotifLen)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkOpen("send notification"); err != nil {
		return err
	}
	c, err := a.connLocked("send notification", remoteName)
	if err != nil {
		return err
	}
	return c.enqueue(&frame{kind: kindNotif, notif: append([]byte{}, msg...), hasNotif: true})
}

// Notifs returns and forgets the received notifications.
func (a *Agent) Notifs() ([]transfer.Notif, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkOpen("notifications"); err != nil {
		return nil, err
	}
	out := a.notifs[a.notifHead:]
	if a.notifsDropped > 0 {
		a.log.Warn("notification queue was full, dropped the oldest", "dropped", a.notifsDropped, "max", a.cfg.MaxQueuedNotifs)
	}
	a.notifs, a.notifHead, a.notifsDropped = nil, 0, 0
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// deliver queues a received notification. It is called only after the
// transfer's data landed.
func (a *Agent) deliver(from string, msg []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	if len(a.notifs)-a.notifHead >= a.cfg.MaxQueuedNotifs {
		// Drop the oldest in O(1): advance the head, and move the
		// queue back to the front of its array once half of it is
		// dropped entries, so each drop costs one moved entry at most.
		if a.notifsDropped == 0 {
			a.log.Warn("notification queue full, dropping the oldest until Notifs takes them", "max", a.cfg.MaxQueuedNotifs)
		}
		a.notifsDropped++
		a.notifs[a.notifHead] = transfer.Notif{}
		a.notifHead++
		if a.notifHead >= len(a.notifs)/2 {
			n := copy(a.notifs, a.notifs[a.notifHead:])
			clear(a.notifs[n:])
			a.notifs, a.notifHead = a.notifs[:n], 0
		}
	}
	a.notifs = append(a.notifs, transfer.Notif{From: from, Msg: msg})
}

// connLocked returns the connection to a remote agent, starting it when
// needed. The caller holds a.mu.
func (a *Agent) connLocked(op, name string) (*peerConn, error) {
	r := a.remotes[name]
	if r == nil {
		return nil, a.errorf(op, name, transfer.ErrUnknownAgent, "")
	}
	if r.conn == nil || r.conn.isDead() {
		r.conn = a.startConn(name, r.md)
	}
	return r.conn, nil
}

// Close stops the listener, closes every connection, fails running
// requests with ErrClosed and waits for the agent's goroutines.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return a.errorf("close", "", transfer.ErrClosed, "")
	}
	a.closed = true
	conns := make([]*peerConn, 0, len(a.remotes))
	for _, r := range a.remotes {
		if r.conn != nil {
			conns = append(conns, r.conn)
		}
	}
	a.remotes = nil
	for c := range a.served {
		_ = c.Close()
	}
	a.notifs, a.notifHead = nil, 0
	a.mu.Unlock()
	err := a.ln.Close()
	for _, c := range conns {
		c.fail(a.errorf("transfer", c.remote, transfer.ErrClosed, ""))
	}
	a.wg.Wait()
	if err != nil {
		return fmt.Errorf("tcp: agent %s: close listener: %w", a.cfg.Name, err)
	}
	return nil
}
