package dynamo

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// ErrConfig is wrapped by errors about a watcher's configuration.
var ErrConfig = errors.New("dynamo: invalid configuration")

// DefaultTTL is how long the file store keeps a key its writer stopped
// touching: Dynamo's writers refresh their files' modification times every
// third of it and delete them when they stop cleanly.
const DefaultTTL = 10 * time.Second

// tempPrefix marks the file store's files being written.
const tempPrefix = ".tmp_"

// DefaultFileDir returns the file store's root as Dynamo picks it: the
// environment variable DYN_FILE_KV, else dynamo_store_kv in the temporary
// directory.
func DefaultFileDir() string {
	if d := os.Getenv("DYN_FILE_KV"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "dynamo_store_kv")
}

// FileKey returns the key a file store file holds: the bucket joined with
// the file's name, percent-decoded (Dynamo escapes every byte but letters
// and digits: "dynamo%2Fbackend%2Fgenerate%2F65a2..." is
// "dynamo/backend/generate/65a2..."). Errors wrap ErrValue.
func FileKey(bucket, name string) (string, error) {
	k, err := url.PathUnescape(name)
	if err != nil || k == "" {
		return "", fmt.Errorf("%w: file name %q is not an escaped key", ErrValue, name)
	}
	return bucket + "/" + k, nil
}

// FileWatcher follows Dynamo's file store (--discovery-backend file, the
// directory DYN_FILE_KV) and feeds the deployment a Selector picks to a
// Sink each time it changes.
//
// The store keeps one file per key in a directory per bucket. A file is
// live while its writer keeps touching it: a worker that stops cleanly
// deletes its files, one that dies leaves them until they are TTL old,
// so a file older than TTL counts as absent. The watcher never writes to
// the store. It lists the buckets at start, again after each change
// fsnotify reports, and every Resync (which also ages out dead workers'
// files and recovers from missed notifications).
type FileWatcher struct {
	// Dir is the store's root (DYN_FILE_KV; see DefaultFileDir).
	// Required. It may not exist yet.
	Dir string
	// Selector picks the workers.
	Selector Selector
	// TTL is the age after which an untouched file counts as absent.
	// Zero means DefaultTTL; negative disables the check.
	TTL time.Duration
	// Resync is the period of full listings. Zero means one second.
	Resync time.Duration
	// Poll disables file notifications: the watcher follows the store by
	// its listings alone, one Resync late. Use it for a store on a network
	// filesystem, whose other hosts' writes inotify does not see.
	Poll bool
	// Logger receives invalid values and watch errors. Nil discards.
	Logger *slog.Logger
	// Now is the clock files are aged with; nil means time.Now.
	Now func() time.Time
}

// fileCache remembers a file's decoded value until the file is replaced
// (the store writes by renaming a new file over the old one).
type fileCache struct {
	info fs.FileInfo
	key  string
	rec  Record
	err  error
}

// Run lists the store, syncs the sink, and follows changes until ctx ends;
// it then returns ctx's error.
func (w *FileWatcher) Run(ctx context.Context, sink Sink) error {
	if w.Dir == "" || sink == nil {
		return fmt.Errorf("%w: Dir and a sink are required", ErrConfig)
	}
	log := w.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	resync := w.Resync
	if resync <= 0 {
		resync = time.Second
	}
	r := &fileRun{w: w, log: log, cache: map[string]*fileCache{}, watched: map[string]bool{}}
	// Without notifications (the host's inotify limits reached) the
	// listings alone follow the store, one Resync late.
	var events chan fsnotify.Event
	var errs chan error
	if w.Poll {
		// listings only
	} else if fw, err := fsnotify.NewWatcher(); err != nil {
		log.WarnContext(ctx, "dynamo: no file notifications, relying on listings", "dir", w.Dir, "err", err)
	} else {
		defer fw.Close()
		r.fw, events, errs = fw, fw.Events, fw.Errors
	}
	tick := time.NewTicker(resync)
	defer tick.Stop()
	// Changes come in bursts (a worker writes several files); one listing
	// follows each burst.
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	var last *Deployment
	for {
		d, err := r.scan(ctx)
		if err != nil {
			// A store that cannot be read now is not an empty one: keep
			// the last deployment until a listing succeeds.
			log.WarnContext(ctx, "dynamo: store not read, deployment kept", "dir", w.Dir, "err", err)
		} else if last == nil || !reflect.DeepEqual(*last, d) {
			logDeployment(ctx, log, d)
			sink.Sync(ctx, d)
			last = &d
		}
		for wait := true; wait; {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
				wait = false
			case <-settle.C:
				wait = false
			case ev, ok := <-events:
				if !ok {
					return fmt.Errorf("dynamo: file watch closed")
				}
				if ev.Op.Has(fsnotify.Remove) || ev.Op.Has(fsnotify.Rename) {
					delete(r.watched, ev.Name) // a watched directory went: watch it again once back
				}
				if ev.Op == fsnotify.Chmod || strings.HasPrefix(filepath.Base(ev.Name), tempPrefix) {
					continue // keep-alive touches and half-written files
				}
				delete(r.cache, ev.Name) // rewritten in place: read it again

				settle.Reset(20 * time.Millisecond)
			case err, ok := <-errs:
				if !ok {
					return fmt.Errorf("dynamo: file watch closed")
				}
				log.WarnContext(ctx, "dynamo: file watch error, relying on listings", "dir", w.Dir, "err", err)
				clear(r.cache) // events may have been lost: read every file again
			}
		}
	}
}

// fileRun is one Run's state.
type fileRun struct {
	w       *FileWatcher
	log     *slog.Logger
	fw      *fsnotify.Watcher
	cache   map[string]*fileCache // by path
	watched map[string]bool       // directories added to fw
	scans   int                   // listings made
}

// rereadEvery is how many listings reuse the cache before every file is
// read again, in case a notification of an in-place rewrite was lost.
const rereadEvery = 30

// scan lists every bucket and returns the deployment of its live files.
// It returns an error when a bucket or a file cannot be read (other than
// for not existing): the store's state is then unknown, not empty.
func (r *fileRun) scan(ctx context.Context) (Deployment, error) {
	if r.scans++; r.scans%rereadEvery == 0 {
		clear(r.cache)
	}
	ttl := r.w.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	now := time.Now
	if r.w.Now != nil {
		now = r.w.Now
	}
	var st State
	seen := map[string]bool{}
	// Watch the root and v1 too, so that buckets created later are seen
	// at once.
	r.watch(ctx, r.w.Dir)
	r.watch(ctx, filepath.Join(r.w.Dir, "v1"))
	for _, b := range Buckets {
		dir := filepath.Join(r.w.Dir, filepath.FromSlash(b))
		r.watch(ctx, dir)
		ents, err := os.ReadDir(dir)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // no such bucket yet
			}
			return Deployment{}, fmt.Errorf("listing %s: %w", dir, err)
		}
		t := now()
		for _, de := range ents {
			name := de.Name()
			if !de.Type().IsRegular() || strings.HasPrefix(name, tempPrefix) {
				continue
			}
			path := filepath.Join(dir, name)
			info, err := de.Info()
			if err != nil {
				continue // removed since the listing
			}
			if ttl > 0 && t.Sub(info.ModTime()) > ttl {
				continue // its writer is gone
			}
			seen[path] = true
			c := r.cache[path]
			// A file replaced (renamed over) is another file; one rewritten
			// in place is reported by a notification, or, when polling,
			// has a new modification time (as after each keep-alive touch).
			if c == nil || !os.SameFile(c.info, info) || c.info.Size() != info.Size() ||
				(r.fw == nil && !c.info.ModTime().Equal(info.ModTime())) {
				if c, err = r.load(ctx, b, name, path, info); err != nil {
					return Deployment{}, err
				}
				r.cache[path] = c
			}
			if c.err == nil {
				if st.entries == nil {
					st.entries = map[string]entry{}
				}
				st.entries[c.key] = entry{rec: c.rec}
			}
		}
	}
	for p := range r.cache {
		if !seen[p] {
			delete(r.cache, p)
		}
	}
	return st.Deployment(r.w.Selector), nil
}

// load reads and decodes one file. A file that is not a store record is
// left out: the error is logged once per file version and cached. A file
// removed since the listing is left out too. A file that cannot be read
// for another reason is an error, and nothing is cached.
func (r *fileRun) load(ctx context.Context, bucket, name, path string, info fs.FileInfo) (*fileCache, error) {
	c := &fileCache{info: info}
	key, err := FileKey(bucket, name)
	if err == nil {
		var b []byte
		b, err = os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("reading %s: %w", path, err)
		default:
			c.rec, err = Decode(b)
		}
	}
	c.key, c.err = key, err
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.log.WarnContext(ctx, "dynamo: invalid store file left out", "path", path, "err", err)
	}
	return c, nil
}

// watch adds dir to the fsnotify watch once it exists.
func (r *fileRun) watch(ctx context.Context, dir string) {
	if r.fw == nil || r.watched[dir] {
		return
	}
	if err := r.fw.Add(dir); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.log.WarnContext(ctx, "dynamo: cannot watch directory, relying on listings", "dir", dir, "err", err)
			r.watched[dir] = true // do not warn every listing
		}
		return
	}
	r.watched[dir] = true
}
