package epp_test

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

func Example() {
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	if err != nil {
		panic(err)
	}
	eps := &epp.Endpoints{}
	for id, addr := range map[kvroute.WorkerID]string{1: "10.0.0.7:8000", 2: "10.0.0.8:8000"} {
		if err := r.AddWorker(router.StaticWorker{WorkerID: id, Block: 16}); err != nil {
			panic(err)
		}
		if err := eps.Set(kvroute.WorkerKey{ID: id}, addr); err != nil {
			panic(err)
		}
	}
	picker, err := epp.New(epp.Config{
		Router:    r,
		Endpoints: eps,
		Tokenizer: epp.TokenizerFunc(func(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error) {
			return fakeengine.Words(ctx, req, dst) // with real engines: &render.Client{URL: ...}
		}),
		Adapters: map[string]string{"support-bot": "support-lora-v3"},
	})
	if err != nil {
		panic(err)
	}
	g := grpc.NewServer()
	picker.Register(g)
	picker.SetReady(true)
	fmt.Println(picker.Ready(), eps.Len())
	// go g.Serve(listener)
	// Output: true 2
}
