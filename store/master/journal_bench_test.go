package master

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
	"github.com/mooncake-go/mooncake/internal/secure"
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
			j := newEtcdJournal(cli, "b-"+via, l.Term(), 0, 0, false)
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

// BenchmarkSnapshotStall measures what a snapshot of 100000 objects costs
// the requests meanwhile: the longest an ExistKey waited (max_us), the
// ExistKeys answered while it ran (gets), with puts going on, and the
// snapshot's own time. locked is the snapshot that held every shard for
// the whole copy; shards copies one shard at a time.
func BenchmarkSnapshotStall(b *testing.B) {
	s, err := NewService(ServiceConfig{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := s.MountSegment(ctx, "a", seg("1", 1<<30, 1<<30)); err != nil {
		b.Fatal(err)
	}
	const n = 100000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		if _, err := s.PutStart(ctx, "a", keys[i], 1024, nil); err != nil {
			b.Fatal(err)
		}
		if err := s.PutEnd(ctx, "a", keys[i], 7); err != nil {
			b.Fatal(err)
		}
	}
	j, err := openFileJournal(b.TempDir(), 0, 0, 1, slog.Default())
	if err != nil {
		b.Fatal(err)
	}
	defer j.close()
	s.j = j
	w := 0
	for _, way := range []string{"locked", "shards"} {
		b.Run(way, func(b *testing.B) {
			var worst, took time.Duration
			gets := 0
			for b.Loop() {
				stop := make(chan struct{})
				var wg sync.WaitGroup
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						t0 := time.Now()
						_, _ = s.ExistKey(keys[i%n])
						worst = max(worst, time.Since(t0))
						gets++
					}
				})
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						key := fmt.Sprintf("w%d", w)
						w++
						if _, err := s.PutStart(ctx, "a", key, 1024, nil); err == nil {
							_ = s.PutEnd(ctx, "a", key, 7)
						}
					}
				})
				t0 := time.Now()
				if way == "locked" {
					s.snapshotLocked(snapChunkObjs)
				} else {
					s.snapshot(snapChunkObjs)
				}
				took += time.Since(t0)
				close(stop)
				wg.Wait()
			}
			b.ReportMetric(float64(worst.Microseconds()), "max_us")
			b.ReportMetric(float64(gets)/float64(b.N), "gets")
			b.ReportMetric(float64(took.Microseconds())/float64(b.N), "snapshot_us")
		})
	}
}

// BenchmarkStandbyAck measures one record's append-to-durable time on a
// leader with a warm standby: acknowledged by the standby (acks), or
// written to etcd first (sync-etcd, HAConfig.SyncEtcd). Its yardstick,
// loopback-tcp, is the floor of an acknowledgement: one small message
// each way between two goroutines of this process over loopback TCP, the
// answer written by the goroutine that read the message.
func BenchmarkStandbyAck(b *testing.B) {
	b.Run("loopback-tcp", benchLoopbackRoundTrip)
	e, err := embedetcd.Start(b.TempDir(), "127.0.0.1:0", embedetcd.NoFsync())
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	files, err := secure.Generate(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	// acks-tls: the masters serve mutual TLS, the standby fetches over it
	// (sync-etcd is what a put under TLS waited for before).
	for _, mode := range []string{"acks", "acks-tls", "sync-etcd"} {
		b.Run(mode, func(b *testing.B) {
			var servers []*Server
			var tlsCfg secure.TLS
			if mode == "acks-tls" {
				tlsCfg = files.ServerTLS()
			}
			for range 2 {
				s, err := Start(ServerConfig{Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), TLS: tlsCfg,
					HA: &HAConfig{Etcd: []string{e.Addr()}, Client: e.Client(), ClusterID: "sb-" + mode, SyncEtcd: mode == "sync-etcd",
						TLSStandbyAcks: mode == "acks-tls"}})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				servers = append(servers, s)
				for !servers[0].Leading() {
					time.Sleep(time.Millisecond)
				}
			}
			j := servers[0].Service().j.(*etcdJournal)
			for deadline := time.Now().Add(10 * time.Second); mode != "sync-etcd"; {
				if _, in := j.standbyState(); in || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			rec := &storepb.JournalRecord{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: "k"}}}
			for b.Loop() {
				if err := j.wait(b.Context(), j.append(rec, nil)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchLoopbackRoundTrip(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}
