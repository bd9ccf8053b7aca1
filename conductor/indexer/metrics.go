package indexer

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports every publisher's state at each scrape, labelled by
// instance and DP rank:
//
//	mooncake_conductor_kv_events_blocks            blocks held (gauge)
//	mooncake_conductor_kv_events_connected         1 while subscribed
//	mooncake_conductor_kv_events_lag_seconds       last batch's arrival less its timestamp
//	mooncake_conductor_kv_events_batches_total     batches applied
//	mooncake_conductor_kv_events_replayed_total    of them, from the replay socket
//	mooncake_conductor_kv_events_gaps_total        sequence gaps seen
//	mooncake_conductor_kv_events_resets_total      times the publisher's blocks were dropped
//	mooncake_conductor_kv_events_malformed_total   batches skipped
func (x *Indexer) Collector() prometheus.Collector { return collector{x} }

type collector struct{ x *Indexer }

var labels = []string{"instance", "dp_rank", "type"}

func desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("mooncake_conductor_kv_events_"+name, help, labels, nil)
}

var (
	descBlocks    = desc("blocks", "Blocks the publisher holds, as its events say.")
	descConnected = desc("connected", "1 while the subscription to the publisher is up.")
	descLag       = desc("lag_seconds", "The last batch's arrival less the publisher's timestamp.")
	descBatches   = desc("batches_total", "Batches applied.")
	descReplayed  = desc("replayed_total", "Batches applied from the replay socket.")
	descGaps      = desc("gaps_total", "Gaps in the publisher's sequence numbers.")
	descResets    = desc("resets_total", "Times the publisher's blocks were dropped (restart, gone, lost events).")
	descMalformed = desc("malformed_total", "Batches skipped as malformed.")
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBlocks, descConnected, descLag, descBatches, descReplayed, descGaps, descResets, descMalformed} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.x.Stats() {
		l := []string{s.Instance, strconv.Itoa(s.DPRank), s.Type}
		connected := 0.0
		if s.Events.Connected {
			connected = 1
		}
		ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(s.Blocks), l...)
		ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, connected, l...)
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, s.Lag, l...)
		ch <- prometheus.MustNewConstMetric(descBatches, prometheus.CounterValue, float64(s.Events.Batches), l...)
		ch <- prometheus.MustNewConstMetric(descReplayed, prometheus.CounterValue, float64(s.Events.Replayed), l...)
		ch <- prometheus.MustNewConstMetric(descGaps, prometheus.CounterValue, float64(s.Events.Gaps), l...)
		ch <- prometheus.MustNewConstMetric(descResets, prometheus.CounterValue, float64(s.Events.Resets), l...)
		ch <- prometheus.MustNewConstMetric(descMalformed, prometheus.CounterValue, float64(s.Events.Malformed), l...)
	}
}
