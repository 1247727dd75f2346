package console

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/pglead"
)

// jobView is a job as the API returns it and the UI shows it.
type jobView struct {
	ID              int64     `json:"id"`
	Action          string    `json:"action"`
	Actor           string    `json:"actor"`
	Reason          string    `json:"reason"`
	Detail          string    `json:"detail"`
	To              string    `json:"to"`
	Rate            int       `json:"rate"`
	RecordIDs       []int64   `json:"record_ids"`
	State           string    `json:"state"`
	Matched         int       `json:"matched"`
	Claimed         int       `json:"claimed"`
	Done            int       `json:"done"`
	Skipped         int       `json:"skipped"`
	SkippedStubs    []int64   `json:"skipped_stubs"`
	Errors          []string  `json:"errors"`
	CancelRequested bool      `json:"cancel_requested"`
	CancelledBy     string    `json:"cancelled_by,omitempty"`
	Running         bool      `json:"running"`
	CreatedAt       time.Time `json:"created_at"`
	FinishedAt      time.Time `json:"finished_at,omitzero"`
}

// viewJob is j as the API returns it and the UI shows it: what an operator
// typed (reason, filter) and the errors, without card numbers when masking
// is on, as in the audit log.
func (s *server) viewJob(j failidx.Job) jobView {
	sc := s.mask.For()
	return jobView{ID: j.ID, Action: j.Action, Actor: j.Actor, Reason: sc.String(j.Reason), Detail: sc.String(j.Detail), To: j.To, Rate: j.Rate,
		RecordIDs: nonNil(j.RecordIDs), State: string(j.State), Matched: j.Matched, Claimed: j.Claimed, Done: j.Done,
		Skipped: j.Skipped, SkippedStubs: nonNil(j.SkippedStubs), Errors: s.scrubAll(j.Errors), CancelRequested: j.CancelRequested,
		CancelledBy: j.CancelledBy, Running: j.Owner != "", CreatedAt: j.CreatedAt, FinishedAt: j.FinishedAt}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (s *server) jobs(r *http.Request) ([]jobView, string, error) {
	q := r.URL.Query()
	limit, err := parseLimit(q.Get("limit"))
	if err != nil {
		return nil, "", err
	}
	js, next, err := s.store.Jobs(r.Context(), q.Get("cursor"), limit)
	if err != nil {
		return nil, "", err
	}
	out := make([]jobView, 0, len(js))
	for _, j := range js {
		out = append(out, s.viewJob(j))
	}
	return out, next, nil
}

func (s *server) apiJobs(w http.ResponseWriter, r *http.Request, id identity) {
	js, next, err := s.jobs(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"jobs": js, "next": next})
}

// job reads the job of the path's id.
func (s *server) job(r *http.Request) (failidx.Job, error) {
	jid, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || jid <= 0 {
		return failidx.Job{}, &inputError{code: http.StatusNotFound, field: "id", msg: fmt.Sprintf("job %q: no such job", r.PathValue("id"))}
	}
	return s.store.Job(r.Context(), jid)
}

func (s *server) apiJob(w http.ResponseWriter, r *http.Request, id identity) {
	j, err := s.job(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, s.viewJob(j))
}

// cancelJob asks the path's job to stop and waits a little for it.
func (s *server) cancelJob(r *http.Request, id identity) (failidx.Job, error) {
	j, err := s.job(r)
	if err != nil {
		return j, err
	}
	if j, err = s.acts.CancelJob(r.Context(), id.Name, j.ID); err != nil || j.Finished() {
		return j, err
	}
	// The job's holder sees the request within a second.
	deadline := time.Now().Add(3 * time.Second)
	for !j.Finished() && time.Now().Before(deadline) && pglead.Sleep(r.Context(), 100*time.Millisecond) {
		if j, err = s.store.Job(r.Context(), j.ID); err != nil {
			return j, err
		}
	}
	return j, nil
}

func (s *server) apiCancelJob(w http.ResponseWriter, r *http.Request, id identity) {
	j, err := s.cancelJob(r, id)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, s.viewJob(j))
}
