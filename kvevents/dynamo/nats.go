package dynamo

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/kvevents"
)

// NATSConfig configures a NATSSubscriber.
type NATSConfig struct {
	// Conn is the connection to the NATS server Dynamo publishes on.
	// Required; the subscriber does not close it.
	Conn *nats.Conn
	// Sink, Load and Logger are as in Config.
	Sink   kvevents.Sink
	Load   LoadReporter
	Logger *slog.Logger
	// Query and RecoveryGiveUp are as in Config.
	Query          Querier
	RecoveryGiveUp time.Duration
}

// NATSChannel is one Dynamo event channel on NATS: a v1/event_channels
// record whose transport kind is "Nats".
type NATSChannel struct {
	// Subject is the channel's subject: the record's
	// transport.config.subject_prefix, a dot and its topic (see Subject).
	// Required; it identifies the channel in RemoveChannel.
	Subject string
	// KVCapacityBlocks, BlockSize, MaxRequests, MaxBatchedTokens and
	// Recovery are as in Publisher.
	KVCapacityBlocks, BlockSize   int
	MaxRequests, MaxBatchedTokens int
	Recovery                      *RecoveryTarget
}

// NATSSubscriber applies what Dynamo workers publish on the NATS event
// plane to an index and a router, as Subscriber does for ZMQ: each message
// body is an Envelope (no frame header), the topic is the envelope's (or
// the subject's last token), and sequences, gaps, duplicates, restarts and
// malformed messages are handled as Subscriber documents. Core NATS
// delivers at most once: lost messages show as gaps.
//
// A NATSSubscriber does nothing until the host calls Run; AddChannel,
// RemoveChannel and Stats may be called from any goroutine.
type NATSSubscriber struct {
	cfg     NATSConfig
	log     *slog.Logger
	stats   counters
	running atomic.Bool
	// sessions numbers the subscriptions made (see natsSub.session).
	sessions atomic.Uint64

	chans  followed[NATSChannel] // by subject
	starts dpStarts              // data_parallel_start_rank by worker
}

// NewNATS returns a NATSSubscriber for cfg, or an error wrapping ErrConfig
// when Conn, or both Sink and Load, are missing.
func NewNATS(cfg NATSConfig) (*NATSSubscriber, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("%w: no NATS connection", ErrConfig)
	}
	if cfg.Sink == nil && cfg.Load == nil {
		return nil, fmt.Errorf("%w: neither Sink nor Load", ErrConfig)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &NATSSubscriber{cfg: cfg, log: log, chans: newFollowed[NATSChannel]()}, nil
}

// AddChannel makes the subscriber follow ch (replacing an earlier channel
// with the same subject). It returns an error wrapping ErrConfig for an
// empty subject, one with wildcards, or negative counts.
func (s *NATSSubscriber) AddChannel(ch NATSChannel) error {
	if ch.Subject == "" || strings.ContainsAny(ch.Subject, "*> \t") {
		return fmt.Errorf("%w: NATS subject %q", ErrConfig, ch.Subject)
	}
	if err := checkLimits(ch.KVCapacityBlocks, ch.BlockSize, ch.MaxRequests, ch.MaxBatchedTokens); err != nil {
		return err
	}
	s.chans.put(ch.Subject, ch)
	return nil
}

// SetDPStartRanks sets the data_parallel_start_rank of the workers whose
// ranks do not start at 0, as Subscriber.SetDPStartRanks does.
func (s *NATSSubscriber) SetDPStartRanks(starts map[uint64]int) error { return s.starts.set(starts) }

// DPStartRank returns the start rank SetDPStartRanks gave worker, 0 if
// none.
func (s *NATSSubscriber) DPStartRank(worker uint64) int { return int(s.starts.get(worker)) }

// RemoveChannel stops following subject and forgets the sequence state of
// its publishers. Like Subscriber.RemovePublisher it is synchronous: once
// it returns, nothing received on subject reaches the sink or the load
// reporter. It does not touch the index.
func (s *NATSSubscriber) RemoveChannel(subject string) { s.chans.remove(subject) }

// publisher is ch as a Publisher (its subject as the endpoint).
func (ch NATSChannel) publisher() Publisher {
	return Publisher{Endpoint: ch.Subject, KVCapacityBlocks: ch.KVCapacityBlocks, BlockSize: ch.BlockSize,
		MaxRequests: ch.MaxRequests, MaxBatchedTokens: ch.MaxBatchedTokens, Recovery: ch.Recovery}
}

// Stats returns the subscriber's counters. Reconnects counts
// subscriptions made.
func (s *NATSSubscriber) Stats() Stats { return s.stats.snapshot() }

// natsSub is one followed subject while Run runs.
type natsSub struct {
	ch  NATSChannel
	src source
	sub *nats.Subscription
	ids map[uint64]struct{} // publisher ids seen on it
	// session numbers the subscription (see inbound.session).
	session uint64
}

// Run follows the channels (as they are added and removed) until ctx
// ends. It returns nil when ctx ends, ErrRunning if Run is already
// running, or an error when a subscription cannot be made (the connection
// is closed). Its subscriptions are gone when it returns. Reconnecting is
// the connection's business (nats.go resubscribes on reconnect); messages
// lost meanwhile show as gaps.
func (s *NATSSubscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer s.running.Store(false)
	s.chans.start()
	defer s.chans.stop()
	ctx, cancel := context.WithCancel(ctx)
	c := newCore(ctx, s.cfg.Sink, s.cfg.Load, &s.cfg.Query, s.cfg.RecoveryGiveUp, s.log, &s.stats, &s.starts)
	defer func() { cancel(); c.wg.Wait() }()
	msgs := make(chan *nats.Msg, queueLen)
	subs := make(map[string]*natsSub)
	defer func() {
		for _, ns := range subs {
			_ = ns.sub.Unsubscribe()
		}
	}()
	reconcile := func() error {
		want, waiting := s.chans.snapshot()
		defer release(waiting)
		for subj, ns := range subs {
			if ch, ok := want[subj]; !ok || !samePublisher(ch.publisher(), ns.ch.publisher()) {
				_ = ns.sub.Unsubscribe()
				c.forget(ns.ids, ns.src)
				delete(subs, subj)
			}
		}
		for subj, ch := range want {
			if subs[subj] != nil {
				continue
			}
			sub, err := s.cfg.Conn.ChanSubscribe(subj, msgs)
			if err != nil {
				return fmt.Errorf("dynamo: subscribe %s: %w", subj, err)
			}
			_ = sub.SetPendingLimits(-1, -1)
			s.stats.reconnects.Add(1)
			p := ch.publisher()
			subs[subj] = &natsSub{ch: ch, src: sourceOf(&p), sub: sub, ids: make(map[uint64]struct{}), session: s.sessions.Add(1)}
			c.added(subs[subj].src)
		}
		return nil
	}
	if err := reconcile(); err != nil {
		return err
	}
	var e Envelope
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.chans.wake:
			if err := reconcile(); err != nil {
				return err
			}
		case res := <-c.results:
			c.answered(&res)
		case m := <-msgs:
			ns := subs[m.Subject]
			if ns == nil || m.Sub != ns.sub {
				continue // from a subscription removed since
			}
			if err := DecodeEnvelope(m.Data, &e); err != nil {
				s.stats.malformed.Add(1)
				s.log.Warn("dynamo: skipping malformed message", "subject", m.Subject, "err", err)
			} else {
				topic := e.Topic
				if topic == "" {
					topic = topicString([]byte(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]))
				}
				ns.ids[e.PublisherID] = struct{}{}
				c.handle(topic, &e, ns.src, ns.session)
			}
			s.stats.received.Add(1) // last: see Stats.Received
		}
	}
}
