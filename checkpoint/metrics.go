package checkpoint

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/coremetrics"
)

// collectors is the set of the checkpoint runner's collectors (the
// idem_checkpoint_* rows of the table in package metrics' doc). The job
// label is the job's name, which comes from code. Use newCollectors; all
// methods are safe for concurrent use.
type collectors struct {
	Rows          *prometheus.CounterVec   // idem_checkpoint_rows_total
	Chunks        *prometheus.CounterVec   // idem_checkpoint_chunks_total
	ChunkDuration *prometheus.HistogramVec // idem_checkpoint_chunk_duration_seconds
	LockWait      *prometheus.HistogramVec // idem_checkpoint_lock_wait_seconds
}

// newCollectors creates the checkpoint collectors and registers them on reg.
// A nil reg registers nothing (the collectors still work, unexported).
// Registering on a registry that already holds them reuses the existing
// collectors, so several runners may share one registry.
func newCollectors(reg prometheus.Registerer) (*collectors, error) {
	m := &collectors{
		Rows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_checkpoint_rows_total",
			Help: "Rows processed in committed chunks."}, []string{"job"}),
		Chunks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_checkpoint_chunks_total",
			Help: "Chunks by result: committed, failed (rolled back, checkpoint unchanged)."}, []string{"job", "result"}),
		ChunkDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_checkpoint_chunk_duration_seconds",
			Help:    "One chunk: read, process, and commit with the checkpoint.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"job"}),
		LockWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_checkpoint_lock_wait_seconds",
			Help:    "Time waiting for the job's advisory lock while another runner held it.",
			Buckets: []float64{.001, .01, .1, .5, 1, 5, 10, 30, 60}}, []string{"job"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.Rows = coremetrics.Register(reg, m.Rows, &err)
	m.Chunks = coremetrics.Register(reg, m.Chunks, &err)
	m.ChunkDuration = coremetrics.Register(reg, m.ChunkDuration, &err)
	m.LockWait = coremetrics.Register(reg, m.LockWait, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}
