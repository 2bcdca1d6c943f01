package zmqdial

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/internal/zmqtest"
)

func TestDial(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		endpoint string
		timeout  time.Duration
		want     error // nil: connects
	}{
		{name: "a ZMQ publisher", endpoint: "tcp://" + pub.Addr().String(), timeout: 5 * time.Second},
		{name: "a peer that never speaks", endpoint: zmqtest.SilentPeer(t, nil), timeout: 200 * time.Millisecond, want: ErrNoGreeting},
		{name: "a peer that speaks HTTP", endpoint: zmqtest.SilentPeer(t, func(c net.Conn) { _, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) }),
			timeout: 300 * time.Millisecond, want: ErrNoGreeting},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0))
			defer sub.Close()
			start := time.Now()
			err := Dial(ctx, sub, tt.endpoint, tt.timeout)
			if tt.want == nil && err != nil {
				t.Fatalf("Dial: %v", err)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("Dial: %v, want %v", err, tt.want)
			}
			if elapsed := time.Since(start); elapsed > tt.timeout+time.Second {
				t.Fatalf("Dial took %v with a timeout of %v", elapsed, tt.timeout)
			}
		})
	}
}

// A context that ends stops the wait for a silent peer at once.
func TestDialContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(context.Background(), zmq4.WithDialerMaxRetries(0))
	defer sub.Close()
	ep := zmqtest.SilentPeer(t, nil)
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	if err := Dial(ctx, sub, ep, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial: %v, want context.Canceled", err)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Fatalf("Dial returned %v after the context ended", elapsed)
	}
	if err := Dial(context.Background(), sub, ep, 0); err == nil {
		t.Fatal("Dial with no timeout: no error")
	}
}
