package master

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// BenchmarkEtcdJournalAppend measures one record's append-to-durable time
// on an embedded etcd without fsync (the all-in-one store's), one writer at
// a time: the latency a PutStart or PutEnd adds under HA.
func BenchmarkEtcdJournalAppend(b *testing.B) {
	e, err := embedetcd.Start(b.TempDir(), "127.0.0.1:0", embedetcd.NoFsync())
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Addr()}, DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	l, err := ha.Campaign(context.Background(), cli, "b", "me:1", 0)
	if err != nil {
		b.Fatal(err)
	}
	j := newEtcdJournal(cli, "b", l.Term(), 0, 0)
	defer j.close()
	rec := &storepb.JournalRecord{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: "k"}}}
	for b.Loop() {
		if err := j.wait(b.Context(), j.append(rec, nil)); err != nil {
			b.Fatal(err)
		}
	}
}
