package faults

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/chaos"
)

// The checked soak under network faults: clients put, get, upsert and
// remove while the nemesis partitions the leader (from everyone, then
// from etcd and the nodes only), a node and etcd, makes every link lossy,
// and kills a node; the checker then finds no anomaly in the history (no
// wrong bytes, no stale read, no acknowledged write lost). The long run is
// `mooncake chaos --netlab` (README).
func TestSoakUnderNetworkFaults(t *testing.T) {
	lab := labtestNew(t)
	ctx := ctxT(t, 5*time.Minute)
	const lease = 100 * time.Millisecond
	procs, err := chaos.StartProcs(ctx, chaos.ProcsConfig{Command: []string{mooncake(t)}, Lab: lab, Seed: 3,
		NodeArgs:   []string{"--transport", "tcp"},
		MasterArgs: []string{"--default_kv_lease_ttl", lease.String(), "--client_ttl", "4s", "--leader_ttl", "3s"}})
	require.NoError(t, err)
	t.Cleanup(procs.Close)
	steps, err := chaos.ParseSchedule("partition-node@2s+3s,partition-leader@7s+3s,lossy-links@13s+2s,split-leader@17s+3s,partition-etcd@23s+3s,kill-node@28s")
	require.NoError(t, err)
	h, err := chaos.Run(ctx, chaos.Config{Master: procs.MasterURL(), ClusterID: procs.ClusterID(), Leader: procs.Leader,
		Duration: 32 * time.Second, Clients: 3, Keys: 48, ValueSize: 8 << 10, Replicas: 2, OpTimeout: 5 * time.Second,
		Seed: 3, Steps: steps, Faults: procs.Faults(), Host: lab.Local().IP.String(), Transport: "tcp"})
	require.NoError(t, err)
	anomalies := chaos.Check(h.Ops(), h.Evictions(), chaos.CheckConfig{StaleWindow: lease * 3 / 4})
	var report bytes.Buffer
	require.NoError(t, chaos.Report(&report, h, anomalies))
	t.Log("\n" + report.String())
	require.Empty(t, anomalies, "the checker found anomalies")
	record(t, row{"soak", "3 clients: put/get/upsert/remove of 48 keys (8 KiB, 2 replicas), 32 s; 2 HA masters, 3 nodes, etcd, each on its own host",
		"node isolated; leader isolated; every link 5% loss + 20 ms; leader cut from etcd and nodes; etcd isolated; kill -9 of a node",
		"no wrong bytes, no stale read, no acknowledged write lost (checked history)",
		fmt.Sprintf("%d operations, %d faults, 0 anomalies", len(h.Ops()), len(h.Faults()))})
}
