package natsx

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
)

// Errors returned by the constructors.
var (
	// ErrConfig is wrapped by NewPublisher and NewReplica for an invalid
	// configuration.
	ErrConfig = errors.New("natsx: invalid configuration")
	// ErrRunning is returned by Replica.Run when it is already running.
	ErrRunning = errors.New("natsx: replica already running")
)

// DefaultPrefix is the subject prefix a zero Prefix means.
const DefaultPrefix = "kvroute"

// Subjects under the prefix.
func eventsSubject(prefix string) string { return prefix + ".events" }
func loadSubject(prefix string) string   { return prefix + ".load" }
func dumpSubject(prefix string) string   { return prefix + ".dump" }

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Conn is the NATS connection to publish on. Required.
	Conn *nats.Conn
	// Prefix is the subject prefix shared by the publisher and the
	// replicas. Empty means DefaultPrefix.
	Prefix string
	// Hasher hashes the token ids of stored blocks that carry Tokens
	// instead of a Hash. The zero Hasher rejects such events.
	Hasher kvroute.Hasher
	// Logger receives records of failed publishes. Nil discards.
	Logger *slog.Logger
}

// Publisher is a kvevents.Sink that fans events out over NATS to every
// Replica: it sits where an index would, behind a kvevents/zmq Subscriber
// (or any other source), in one relay process per engine or per cluster.
//
// Each event is one message on "<prefix>.events": a Dynamo RouterEvent in
// named msgpack (kvevents.AppendDynamoEvent), event_id = ID-1 (2^64-1 for
// unsequenced events). ResetWorker is sent as an unsequenced Cleared event.
//
// Calls must be serialised per worker, as for any Sink; a Publisher is
// otherwise safe for concurrent use.
type Publisher struct {
	conn    *nats.Conn
	subject string
	hasher  kvroute.Hasher
	log     *slog.Logger
}

// NewPublisher returns a Publisher for cfg, or an error wrapping ErrConfig
// when Conn is nil.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("%w: no NATS connection", ErrConfig)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Publisher{conn: cfg.Conn, subject: eventsSubject(cfg.Prefix), hasher: cfg.Hasher, log: log}, nil
}

// Apply publishes ev. It returns an error when ev is invalid, carries
// tokens without a configured Hasher, or the connection refuses the
// message (closed, or its buffer is full while reconnecting).
func (p *Publisher) Apply(ev *kvroute.Event) error {
	var d kvevents.DynamoEvent
	if err := d.FromEvent(ev, p.hasher); err != nil {
		return err
	}
	msg, err := kvevents.AppendDynamoEvent(nil, &d)
	if err != nil {
		return err
	}
	if err := p.conn.Publish(p.subject, msg); err != nil {
		return fmt.Errorf("natsx: publish: %w", err)
	}
	return nil
}

// ResetWorker publishes an unsequenced Cleared event for w, the reset
// marker: replicas reset the worker in their index (its blocks and its
// event sequence) and apply its following events as a new sequence.
func (p *Publisher) ResetWorker(w kvroute.WorkerKey) {
	ev := kvroute.Event{Kind: kvroute.EventCleared, Worker: w}
	if err := p.Apply(&ev); err != nil {
		p.log.Warn("natsx: publishing a worker reset failed", "worker", w.String(), "err", err)
	}
}
