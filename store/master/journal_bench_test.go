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
// on an embedded etcd without fsync (the all-in-one store's): the latency
// a PutStart or PutEnd adds under HA. grpc reaches etcd as a separate
// etcd is reached, over loopback TCP; inprocess calls the etcd of the same
// process (embedetcd.Etcd.Client, as mooncake up's master does). serial
// waits for each record before the next; parallel appends from GOMAXPROCS
// x 8 goroutines, whose records the journal commits together (group
// commit, up to journalDepth transactions in flight).
func BenchmarkEtcdJournalAppend(b *testing.B) {
	e, err := embedetcd.Start(b.TempDir(), "127.0.0.1:0", embedetcd.NoFsync())
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	for _, via := range []string{"grpc", "inprocess"} {
		b.Run(via, func(b *testing.B) {
			var cli *clientv3.Client
			if via == "grpc" {
				if cli, err = clientv3.New(clientv3.Config{Endpoints: []string{e.Addr()}, DialTimeout: 5 * time.Second}); err != nil {
					b.Fatal(err)
				}
			} else {
				cli = e.Client()
			}
			defer cli.Close()
			l, err := ha.Campaign(context.Background(), cli, "b-"+via, "me:1", 0)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = l.Resign(context.Background()) }()
			j := newEtcdJournal(cli, "b-"+via, l.Term(), 0, 0)
			defer j.close()
			rec := &storepb.JournalRecord{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: "k"}}}
			b.Run("serial", func(b *testing.B) {
				for b.Loop() {
					if err := j.wait(b.Context(), j.append(rec, nil)); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("parallel", func(b *testing.B) {
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := j.wait(context.Background(), j.append(rec, nil)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		})
	}
}
