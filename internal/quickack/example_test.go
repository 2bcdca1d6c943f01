package quickack_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/kvroute/kvroute/internal/quickack"
)

// An HTTP client whose kept-alive connections acknowledge at once, so
// that a streaming server with Nagle's algorithm on cannot hold its first
// chunk back.
func ExampleDialContext() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "data: first chunk")
	}))
	defer srv.Close()

	client := &http.Client{Transport: &http.Transport{
		DialContext: quickack.DialContext(&net.Dialer{Timeout: 5 * time.Second}),
	}}
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(string(body))
	// Output: data: first chunk
}
