// Package chaos is a checked soak of the store, Jepsen-style: clients run
// a mixed workload of puts, gets, upserts and removes while a nemesis
// injects faults on a schedule; every operation goes to a History with
// when it was invoked, when it completed and how (ok, fail, or unknown:
// it may or may not have happened, as a timed-out write); a Check of the
// history afterwards finds what the store got wrong.
//
// Values describe themselves (EncodeValue: key, writer, sequence number,
// CRC-32C), so a get's bytes are attributed to the write that made them or
// shown to match none. The checker (Check) then asks of each get that
// read bytes: did a put or upsert of this key write them, one that may
// have happened (not failed, not begun after the get), and that no
// acknowledged upsert or remove had replaced before the get began? And of
// each get that found nothing, the final reads after the faults among
// them: was no acknowledged write of the key left that nothing could have
// removed? Removes of the workload and evictions the master reports (its
// WatchObjects stream) are the only excuses; a key removed behind the
// workload's back is lost.
//
// Faults implement Fault; Procs provides kill -9 of a storage node or of
// the leading master (restarted after the fault's hold), on a store of
// child processes with etcd in this process. A network fault (partition,
// loss, delay on a link of the namespace harness) is another Fault under
// another name in Config.Faults; the checker does not change.
//
//	p, _ := chaos.StartProcs(ctx, chaos.ProcsConfig{Command: []string{"/usr/bin/mooncake"}})
//	defer p.Close()
//	steps, _ := chaos.ParseSchedule("kill-node@5s,kill-master@12s+2s")
//	h, _ := chaos.Run(ctx, chaos.Config{Master: p.MasterURL(), ClusterID: p.ClusterID(),
//		Leader: p.Leader, Duration: 30 * time.Second, Steps: steps, Faults: p.Faults()})
//	anomalies := chaos.Check(h.Ops(), h.Evictions(), chaos.CheckConfig{StaleWindow: 750 * time.Millisecond})
//	_ = chaos.Report(os.Stdout, h, anomalies)
//
// `mooncake chaos` is this package on the command line.
package chaos
