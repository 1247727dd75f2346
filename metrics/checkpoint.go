package metrics

import "github.com/prometheus/client_golang/prometheus"

// Checkpoint metric names (package checkpoint). The only label is the job
// name, which comes from code.
//
//	idem_checkpoint_rows_total{job}               rows processed in committed chunks
//	idem_checkpoint_chunks_total{job,result}      chunks: committed, failed (rolled back; the checkpoint did not move)
//	idem_checkpoint_chunk_duration_seconds{job}   one chunk: read, process and commit with the checkpoint
//	idem_checkpoint_lock_wait_seconds{job}        time spent waiting for the job's advisory lock (another runner's chunk)
const (
	CheckpointRowsName          = "idem_checkpoint_rows_total"
	CheckpointChunksName        = "idem_checkpoint_chunks_total"
	CheckpointChunkDurationName = "idem_checkpoint_chunk_duration_seconds"
	CheckpointLockWaitName      = "idem_checkpoint_lock_wait_seconds"
)

// Checkpoint is the set of the checkpoint runner's collectors. Use
// NewCheckpoint; all methods are safe for concurrent use.
type Checkpoint struct {
	Rows          *prometheus.CounterVec   // idem_checkpoint_rows_total
	Chunks        *prometheus.CounterVec   // idem_checkpoint_chunks_total
	ChunkDuration *prometheus.HistogramVec // idem_checkpoint_chunk_duration_seconds
	LockWait      *prometheus.HistogramVec // idem_checkpoint_lock_wait_seconds
}

// NewCheckpoint creates the checkpoint collectors and registers them on reg.
// A nil reg registers nothing (the collectors still work, unexported).
// Registering on a registry that already holds them reuses the existing
// collectors, so several runners may share one registry.
func NewCheckpoint(reg prometheus.Registerer) (*Checkpoint, error) {
	m := &Checkpoint{
		Rows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: CheckpointRowsName,
			Help: "Rows processed in committed chunks."}, []string{"job"}),
		Chunks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: CheckpointChunksName,
			Help: "Chunks by result: committed, failed (rolled back, checkpoint unchanged)."}, []string{"job", "result"}),
		ChunkDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: CheckpointChunkDurationName,
			Help:    "One chunk: read, process, and commit with the checkpoint.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"job"}),
		LockWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: CheckpointLockWaitName,
			Help:    "Time waiting for the job's advisory lock while another runner held it.",
			Buckets: []float64{.001, .01, .1, .5, 1, 5, 10, 30, 60}}, []string{"job"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.Rows = register(reg, m.Rows, &err)
	m.Chunks = register(reg, m.Chunks, &err)
	m.ChunkDuration = register(reg, m.ChunkDuration, &err)
	m.LockWait = register(reg, m.LockWait, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}
