package tcp_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/tcp"
)

// Two agents exchange metadata and a standalone notification.
func ExampleNew() {
	a, err := tcp.New(tcp.Config{Name: "a"})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := tcp.New(tcp.Config{Name: "b"})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	md, _ := b.LocalMetadata()
	name, _ := a.LoadRemoteMetadata(md)
	if err := a.SendNotif(name, []byte("hello")); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := transfer.NewInbox(b).Wait(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s from %s\n", n.Msg, n.From)
	// Output: hello from a
}
