package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/failidx"
)

// actionRequest is the body of the record actions.
type actionRequest struct {
	// IDs selects records one by one.
	IDs []int64 `json:"ids"`
	// Filter selects every record that matches: one failure group's row
	// (its full fingerprint, kind, consumer group and DLQ topic, status
	// unresolved). Needs the admin role; a filter that names no row needs
	// AllGroups too.
	Filter *filterBody `json:"filter"`
	// AllGroups says a Filter that names no single failure-group row (a
	// fingerprint prefix, a kind across groups) is meant: every matching
	// record of every group.
	AllGroups bool `json:"all_groups"`
	// To is replay's target: "" for each record's origin topic, else one
	// of its retry tiers for its group, or a topic of Config.ReplayTopics.
	To string `json:"to"`
	// Rate caps replay at this many records a second (0: no cap).
	Rate   int    `json:"rate"`
	Reason string `json:"reason"`
}

// filterBody is a Filter in a JSON body: the query parameters' names.
type filterBody struct {
	Group       string   `json:"group"`
	Topic       string   `json:"topic"`
	Kind        string   `json:"kind"`
	Fingerprint string   `json:"fingerprint"`
	Key         string   `json:"key"`
	Error       string   `json:"error"`
	Status      []string `json:"status"`
	Since       string   `json:"since"`
	Until       string   `json:"until"`
}

func (b *filterBody) values() map[string][]string {
	return map[string][]string{
		"group": {b.Group}, "topic": {b.Topic}, "kind": {b.Kind}, "fingerprint": {b.Fingerprint},
		"key": {b.Key}, "error": {b.Error}, "status": b.Status, "since": {b.Since}, "until": {b.Until},
	}
}

// decodeJSON reads a JSON body into v, refusing unknown fields and
// trailing data.
func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &inputError{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body over %d bytes", mbe.Limit)}
		}
		return badInput("body", "request body is not valid JSON for this call: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badInput("body", "request body has data after its JSON value")
	}
	return nil
}

// selection checks an action's choice of records: ids or a filter, not
// both and not neither. An operator acts on at most
// Config.MaxOperatorRecords ids; more, or a filter, needs the admin role. A
// filter must name one failure-group row (its whole fingerprint, kind,
// consumer group and DLQ topic), unless allGroups says more is meant.
func (s *server) selection(id identity, ids []int64, fb *filterBody, allGroups bool) (failidx.Selection, error) {
	switch {
	case len(ids) > 0 && fb != nil:
		return failidx.Selection{}, badInput("ids", "give ids or filter, not both")
	case len(ids) == 0 && fb == nil:
		return failidx.Selection{}, badInput("ids", "no records selected: give ids, or a filter (admin)")
	case len(ids) > 0:
		if len(ids) > s.cfg.MaxOperatorRecords && id.Role < Admin {
			return failidx.Selection{}, &inputError{code: http.StatusForbidden, field: "ids",
				msg: fmt.Sprintf("forbidden: %d records in one request: an operator acts on at most %d; more needs the admin role (%s is %s)",
					len(ids), s.cfg.MaxOperatorRecords, id.Name, id.Role)}
		}
		for _, x := range ids {
			if x <= 0 {
				return failidx.Selection{}, badInput("ids", "record id %d: ids are positive integers", x)
			}
		}
		return failidx.Selection{IDs: ids}, nil
	}
	if id.Role < Admin {
		return failidx.Selection{}, &inputError{code: http.StatusForbidden, field: "filter",
			msg: fmt.Sprintf("forbidden: acting on a whole group or filter needs the admin role; %s is %s", id.Name, id.Role)}
	}
	f, err := parseFilter(fb.values())
	if err != nil {
		return failidx.Selection{}, err
	}
	if f.Fingerprint == "" && f.Group == "" && f.Topic == "" && f.Kind == "" && f.Key == "" && f.ErrorContains == "" {
		return failidx.Selection{}, badInput("filter", "the filter selects every record: name at least a fingerprint, group, topic, kind, key or error")
	}
	if !allGroups && !namesARow(f) {
		return failidx.Selection{}, badInput("filter", "the filter names no single failure group: give the row's whole fingerprint (%d hex digits), kind, group and topic, "+
			"or all_groups: true to act on every group it matches", fingerprintLen)
	}
	return failidx.Selection{Filter: &f}, nil
}

// fingerprintLen is the length of a whole fingerprint (dlq.Record.Fingerprint).
const fingerprintLen = 12

// namesARow reports whether f selects one failure-group row of the groups
// page: its whole fingerprint, kind, consumer group and DLQ topic.
func namesARow(f failidx.Filter) bool {
	return len(f.Fingerprint) == fingerprintLen && f.Kind != "" && f.Group != "" && f.Topic != ""
}

// act runs one record action for the API or the UI. A replay runs as a job
// of the console's, not in the request: act waits for it up to
// Config's jobWait (or until the client leaves) and returns the job, and
// whether it has finished.
func (s *server) act(r *http.Request, id identity, action string, sel failidx.Selection, to string, rate int, reason string) (failidx.Result, *failidx.Job, error) {
	reason = strings.TrimSpace(reason)
	if rate < 0 {
		return failidx.Result{}, nil, badInput("rate", "rate %d: want 0 (no cap) or more records a second", rate)
	}
	ctx := r.Context()
	switch action {
	case "replay":
		j, err := s.acts.StartReplay(ctx, id.Name, sel, strings.TrimSpace(to), rate, reason)
		if err != nil {
			return failidx.Result{}, nil, err
		}
		return s.await(r, j)
	case "resolve":
		res, err := s.acts.Resolve(ctx, id.Name, sel, reason)
		return res, nil, err
	case "archive":
		if reason == "" {
			return failidx.Result{}, nil, badInput("reason", "archive needs a reason")
		}
		res, err := s.acts.Archive(ctx, id.Name, sel, reason)
		return res, nil, err
	}
	return failidx.Result{}, nil, &inputError{code: http.StatusNotFound, field: "action", msg: fmt.Sprintf("unknown action %q: want replay, resolve or archive", action)}
}

// await runs job j in the console's goroutine and waits for it up to
// jobWait, or until the client leaves (the job runs on). It returns the
// job as it then is; an error only when a finished job failed.
func (s *server) await(r *http.Request, j failidx.Job) (failidx.Result, *failidx.Job, error) {
	done := s.runJob(j.ID)
	t := time.NewTimer(s.cfg.jobWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-r.Context().Done():
	}
	got, err := s.store.Job(context.WithoutCancel(r.Context()), j.ID)
	if err != nil {
		return failidx.Result{}, &j, err
	}
	if got.State == failidx.JobFailed {
		return got.Result(), &got, fmt.Errorf("job %d failed: %s", got.ID, strings.Join(got.Errors, "; "))
	}
	return got.Result(), &got, nil
}

type resultView struct {
	Matched      int      `json:"matched"`
	Done         int      `json:"done"`
	Skipped      int      `json:"skipped"`
	SkippedStubs []int64  `json:"skipped_stubs"`
	Errors       []string `json:"errors"`
}

// viewResult is res as the API returns it and the UI shows it, its errors
// without card numbers (masking on: no payload is at hand).
func (s *server) viewResult(res failidx.Result) resultView {
	v := resultView{Matched: res.Matched, Done: res.Done, Skipped: res.Skipped, SkippedStubs: res.SkippedStubs, Errors: s.scrubAll(res.Errors)}
	if v.SkippedStubs == nil {
		v.SkippedStubs = []int64{}
	}
	return v
}

// scrubAll returns ss without card numbers when masking is on (the audit
// log's rule: what an operator typed, or an error, may hold one), never nil.
func (s *server) scrubAll(ss []string) []string {
	sc := s.mask.For()
	out := make([]string, len(ss))
	for i, x := range ss {
		out[i] = sc.String(x)
	}
	return out
}

// apiAction serves POST /api/actions/{action}. A replay that has not
// finished within a few seconds answers 202 with its job (GET
// /api/jobs/{id} follows it); one that has, 200 with its result and job.
func (s *server) apiAction(w http.ResponseWriter, r *http.Request, id identity) {
	var req actionRequest
	if err := decodeJSON(r, &req); err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	sel, err := s.selection(id, req.IDs, req.Filter, req.AllGroups)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	res, job, err := s.act(r, id, r.PathValue("action"), sel, req.To, req.Rate, req.Reason)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	s.writeOutcome(w, res, job)
}

// writeOutcome writes an action's result: 200 with the result (and the
// job, for a job that finished), or 202 with a job still running.
func (s *server) writeOutcome(w http.ResponseWriter, res failidx.Result, job *failidx.Job) {
	if job == nil {
		writeJSON200(w, http.StatusOK, s.viewResult(res))
		return
	}
	jv := s.viewJob(*job)
	if !job.Finished() {
		w.Header().Set("Location", s.cfg.BasePath+"/api/jobs/"+strconv.FormatInt(job.ID, 10))
		writeJSON200(w, http.StatusAccepted, map[string]any{"job": jv})
		return
	}
	writeJSON200(w, http.StatusOK, struct {
		resultView
		Job jobView `json:"job"`
	}{s.viewResult(res), jv})
}

type editRequest struct {
	// Value is the new payload, as text (JSON when the original is JSON).
	Value *string `json:"value"`
	// Reason says why (kept with the version and in the audit log).
	Reason string `json:"reason"`
}

// editRetry validates an edit and retry and runs its job as act runs a
// replay's.
func (s *server) editRetry(r *http.Request, id identity, rid int64, value *string, reason string) (failidx.Result, *failidx.Job, error) {
	if value == nil {
		return failidx.Result{}, nil, badInput("value", "value is missing: give the new payload")
	}
	rec, err := s.store.Get(r.Context(), rid)
	if err != nil {
		return failidx.Result{}, nil, fmt.Errorf("record %d: %w", rid, err)
	}
	v := []byte(*value)
	if json.Valid(rec.Value) || rec.Stub {
		if !json.Valid(v) {
			var x any
			err := json.Unmarshal(v, &x)
			return failidx.Result{}, nil, badInput("value", "value is not valid JSON (the original is): %v", err)
		}
	}
	j, err := s.acts.StartEdit(r.Context(), id.Name, rid, v, strings.TrimSpace(reason))
	if err != nil {
		return failidx.Result{}, nil, err
	}
	return s.await(r, j)
}

func (s *server) apiEditRetry(w http.ResponseWriter, r *http.Request, id identity) {
	rid, err := pathID(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	var req editRequest
	if err := decodeJSON(r, &req); err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	res, job, err := s.editRetry(r, id, rid, req.Value, req.Reason)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	s.writeOutcome(w, res, job)
}
