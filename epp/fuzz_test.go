package epp_test

import (
	"context"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/router"
)

// script is an ext_proc stream that plays a fixed list of messages, for
// fuzzing the message handling without the network.
type script struct {
	ctx  context.Context
	msgs []*extprocv3.ProcessingRequest
	sent int
}

func (s *script) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}
func (s *script) Send(*extprocv3.ProcessingResponse) error { s.sent++; return nil }
func (s *script) Context() context.Context                 { return s.ctx }
func (s *script) SetHeader(metadata.MD) error              { return nil }
func (s *script) SendHeader(metadata.MD) error             { return nil }
func (s *script) SetTrailer(metadata.MD)                   {}
func (s *script) SendMsg(any) error                        { return nil }
func (s *script) RecvMsg(any) error                        { return nil }

var _ grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse] = (*script)(nil)

// FuzzProcess: any sequence of ext_proc messages, in any order, with any
// bodies and metadata, is handled without a panic, and every Select it
// made is balanced by a Done when the stream ends.
func FuzzProcess(f *testing.F) {
	f.Add([]byte{0, 1, 2, 4, 5, 6}, `{"model":"m","prompt":"a b c d e f g h i j k l m n o p q r"}`)
	f.Add([]byte{0, 1, 1, 2, 4, 5, 9, 6}, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	f.Add([]byte{8, 1, 3, 4, 7}, `{"prompt":[1,2,3]}`)
	f.Add([]byte{0, 2, 2, 2, 4, 4, 5, 5, 7, 7}, `data: {"usage":{}}`+"\n\n")
	f.Add([]byte{10, 4, 5, 6}, ``)
	f.Fuzz(func(t *testing.T, ops []byte, body string) {
		r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})})
		if err != nil {
			t.Fatal(err)
		}
		eps := &epp.Endpoints{}
		for id := kvroute.WorkerID(1); id <= 2; id++ {
			_ = r.AddWorker(router.StaticWorker{WorkerID: id, Block: 4})
			_ = eps.Set(kvroute.WorkerKey{ID: id}, "10.0.0."+string('0'+rune(id))+":8000")
		}
		s, err := epp.New(epp.Config{Router: r, Endpoints: eps, Tokenizer: epp.TokenizerFunc(fakeengine.Words),
			InjectUsage: len(ops)%2 == 0, MaxBodyBytes: 1 << 12})
		if err != nil {
			t.Fatal(err)
		}
		hv := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }
		served, _ := structpb.NewStruct(map[string]any{epp.KeyServed: "10.0.0.2:8000"})
		upstream, _ := structpb.NewStruct(map[string]any{epp.AttributeUpstream: "10.0.0.1:8000"})
		upstreamAny, _ := structpb.NewStruct(map[string]any{epp.AttributeUpstream: body})
		subset, _ := structpb.NewStruct(map[string]any{epp.KeySubset: []any{"10.0.0.1:8000", body}})
		var msgs []*extprocv3.ProcessingRequest
		rest := []byte(body)
		chunk := func() []byte {
			n := min(len(rest), 7)
			c := rest[:n]
			rest = rest[n:]
			return c
		}
		for i, op := range ops {
			m := &extprocv3.ProcessingRequest{}
			switch op % 11 {
			case 0, 8, 10:
				path := []string{"/v1/completions", "/v1/chat/completions", "/v1/models"}[i%3]
				m.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
					Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{hv(":path", path), hv("x-request-id", body)}}, EndOfStream: op%11 == 10}}
				if op%11 == 8 {
					m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.NamespaceSubset: subset}}
				}
			case 1:
				m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk()}}
			case 2:
				m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk(), EndOfStream: true}}
			case 3:
				m.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}
			case 4:
				st := []string{"200", "503", "429", "x"}[i%4]
				ct := []string{"text/event-stream", "application/json"}[i%2]
				m.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
					Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{hv(":status", st), hv("content-type", ct)}}}}
				// The served endpoint: from the envoy.lb metadata, or from
				// Envoy's upstream.address attribute, a known one or any.
				switch i % 3 {
				case 0:
					m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.NamespaceLB: served}}
				case 1:
					m.Attributes = map[string]*structpb.Struct{epp.AttributesExtProc: upstream}
				case 2:
					m.Attributes = map[string]*structpb.Struct{epp.AttributesExtProc: upstreamAny}
				}
			case 5, 9:
				m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(body)}}
			case 6:
				m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: chunk(), EndOfStream: true}}
			case 7:
				m.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}
			}
			msgs = append(msgs, m)
		}
		if err := s.Process(&script{ctx: context.Background(), msgs: msgs}); err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("Process: %v", err)
		}
		if st := r.Stats(); st.Decisions != st.Outcomes {
			t.Fatalf("%d decisions, %d outcomes", st.Decisions, st.Outcomes)
		}
	})
}
