package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/embedetcd"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// startStore runs a store in the process, as the tests do: an embedded
// etcd, a master that leads through it (HA, with one candidate), and a
// storage node that contributes a segment. It returns the address clients
// give as Config.Master, and a function that stops it all.
func startStore() (masterAddr string, stop func()) {
	dir, err := os.MkdirTemp("", "mooncake-example")
	if err != nil {
		log.Fatal(err)
	}
	etcd, err := embedetcd.Start(dir, "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Logger: quiet,
		HA: &master.HAConfig{Etcd: []string{etcd.Addr()}}})
	if err != nil {
		log.Fatal(err)
	}
	// The master campaigns in the background; clients look the leader up.
	for deadline := time.Now().Add(10 * time.Second); !m.Leading(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			log.Fatal("the master does not lead")
		}
	}
	masterAddr = "etcd://" + etcd.Addr()
	node, err := client.New(context.Background(), client.Config{Master: masterAddr, SegmentSize: 64 << 20,
		LocalBufferSize: 4 << 20, EngineConfig: engine.Config{Host: "127.0.0.1", Logger: quiet}})
	if err != nil {
		log.Fatal(err)
	}
	return masterAddr, func() {
		_ = node.Close()
		_ = m.Close()
		etcd.Close()
		_ = os.RemoveAll(dir)
	}
}

// A client that contributes a segment of its own puts an object with two
// replicas (one in each segment of the pool) and reads it back; a key
// never put is storepb.ErrObjectNotFound. These are the README's lines.
func Example() {
	addr, stop := startStore()
	defer stop()
	ctx := context.Background()
	kv := []byte("the KV cache of one block")

	c, err := client.New(ctx, client.Config{Master: addr, SegmentSize: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Put(ctx, "blk-42", kv, &client.ReplicateConfig{Replicas: 2})
	if err != nil {
		log.Fatal(err)
	}
	v, err := c.Get(ctx, "blk-42")
	fmt.Printf("%s, %v\n", v, err)
	_, err = c.Get(ctx, "blk-43")
	fmt.Println(errors.Is(err, storepb.ErrObjectNotFound))
	// Output:
	// the KV cache of one block, <nil>
	// true
}

// Batches answer item by item: one error per key, nil where the item
// succeeded.
func ExampleClient_BatchPut() {
	addr, stop := startStore()
	defer stop()
	ctx := context.Background()

	c, err := client.New(ctx, client.Config{Master: addr, SegmentSize: client.NoSegment})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	keys := []string{"blk-1", "blk-2", "blk-3"}
	values := [][]byte{[]byte("one"), []byte("two"), []byte("three")}
	errs := c.BatchPut(ctx, keys, values, nil)
	fmt.Println(errs)
	keys = append(keys, "blk-4") // never put
	vals, errs := c.BatchGet(ctx, keys)
	for i, v := range vals {
		fmt.Printf("%q %v\n", v, errs[i] != nil)
	}
	// Output:
	// [<nil> <nil> <nil>]
	// "one" false
	// "two" false
	// "three" false
	// "" true
}

// TestReadmeRunsAsExample: every line of the README's store snippet is a
// line of the examples above, so the README shows code that runs.
func TestReadmeRunsAsExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	example, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	_, snippet, ok := strings.Cut(string(readme), "\nFrom Go")
	require.True(t, ok, "README has no store snippet (From Go)")
	_, snippet, _ = strings.Cut(snippet, "```go\n")
	snippet, _, _ = strings.Cut(snippet, "```")
	lines := map[string]bool{}
	for l := range strings.Lines(string(example)) {
		lines[strings.TrimSpace(l)] = true
	}
	n := 0
	for l := range strings.Lines(snippet) {
		code, _, _ := strings.Cut(l, "//")
		if code = strings.TrimSpace(code); code != "" {
			assert.True(t, lines[code], "README line %q is in no example", code)
			n++
		}
	}
	assert.Positive(t, n, "empty snippet")
}
