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
	"github.com/idemhq/idem/internal/mask"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/seal"
)

// The JSON API's handlers. Each is registered in routes() and described in
// openapi.yaml.

type topicView struct {
	Group                  string    `json:"group"`
	Topic                  string    `json:"topic"`
	Unresolved             int       `json:"unresolved"`
	OldestUnresolved       time.Time `json:"oldest_unresolved,omitzero"`
	OldestUnresolvedAgeSec float64   `json:"oldest_unresolved_age_seconds"`
	ArrivalsLastHour       int       `json:"arrivals_last_hour"`
	ArrivalsPerMinute      float64   `json:"arrivals_per_minute"`
}

func (s *server) overview(r *http.Request) ([]topicView, error) {
	ts, err := s.store.Overview(r.Context())
	if err != nil {
		return nil, err
	}
	now := s.cfg.now()
	out := make([]topicView, 0, len(ts))
	for _, t := range ts {
		v := topicView{Group: t.Group, Topic: t.Topic, Unresolved: t.Unresolved, OldestUnresolved: t.OldestUnresolved,
			ArrivalsLastHour: t.ArrivalsLastHour, ArrivalsPerMinute: float64(t.ArrivalsLastHour) / 60}
		if !t.OldestUnresolved.IsZero() {
			v.OldestUnresolvedAgeSec = now.Sub(t.OldestUnresolved).Seconds()
		}
		out = append(out, v)
	}
	return out, nil
}

func (s *server) apiOverview(w http.ResponseWriter, r *http.Request, _ identity) {
	v, err := s.overview(r)
	if err != nil {
		s.fail(w, r, identity{}, true, err)
		return
	}
	lc, err := s.liveControls(r.Context())
	if err != nil {
		s.fail(w, r, identity{}, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"topics": v, "controls": lc})
}

type groupView struct {
	Fingerprint string    `json:"fingerprint"`
	Kind        string    `json:"kind"`
	Group       string    `json:"group"`
	Topic       string    `json:"topic"`
	SampleError string    `json:"sample_error"`
	Count       int       `json:"count"`
	Unresolved  int       `json:"unresolved"`
	FirstSeen   time.Time `json:"first_seen"`
	LastSeen    time.Time `json:"last_seen"`
}

func (s *server) groups(r *http.Request) ([]groupView, failidx.Filter, error) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		return nil, f, err
	}
	gs, err := s.store.Groups(r.Context(), f)
	if err != nil {
		return nil, f, err
	}
	samples := make([]int64, 0, len(gs))
	for _, g := range gs {
		samples = append(samples, g.SampleID)
	}
	scs, err := s.scrubbers(r.Context(), samples)
	if err != nil {
		return nil, f, err
	}
	out := make([]groupView, 0, len(gs))
	for _, g := range gs {
		sc := scs[g.SampleID]
		if sc == nil {
			sc = s.mask.For() // card numbers only
		}
		out = append(out, groupView{Fingerprint: g.Fingerprint, Kind: g.Kind, Group: g.Group, Topic: g.Topic,
			SampleError: validText(sc.String(g.SampleError)), Count: g.Count, Unresolved: g.Unresolved,
			FirstSeen: g.FirstSeen, LastSeen: g.LastSeen})
	}
	return out, f, nil
}

func (s *server) apiGroups(w http.ResponseWriter, r *http.Request, id identity) {
	gs, _, err := s.groups(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"groups": gs})
}

// list reads one page of records by the request's filter, cursor and limit.
func (s *server) list(r *http.Request) ([]recordView, string, failidx.Filter, error) {
	q := r.URL.Query()
	f, err := parseFilter(q)
	if err != nil {
		return nil, "", f, err
	}
	limit, err := parseLimit(q.Get("limit"))
	if err != nil {
		return nil, "", f, err
	}
	page, err := s.store.List(r.Context(), f, q.Get("cursor"), limit)
	if err != nil {
		return nil, "", f, err
	}
	ids := make([]int64, 0, len(page.Records))
	for _, rec := range page.Records {
		ids = append(ids, rec.ID)
	}
	scs, err := s.scrubbers(r.Context(), ids)
	if err != nil {
		return nil, "", f, err
	}
	out := make([]recordView, 0, len(page.Records))
	for _, rec := range page.Records {
		out = append(out, s.listView(rec, scs[rec.ID]))
	}
	return out, page.Next, f, nil
}

func (s *server) apiRecords(w http.ResponseWriter, r *http.Request, id identity) {
	recs, next, _, err := s.list(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"records": recs, "next": next})
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, &inputError{code: http.StatusNotFound, field: "id", msg: fmt.Sprintf("record %q: no such record (ids are positive integers)", r.PathValue("id"))}
	}
	return id, nil
}

// record reads the record of the path's id; with reveal it checks the
// operator role and audits the reveal first.
func (s *server) record(r *http.Request, id identity, reveal bool) (failidx.Record, error) {
	rid, err := pathID(r)
	if err != nil {
		return failidx.Record{}, err
	}
	if reveal {
		if err := s.audited(r, id, rid); err != nil {
			return failidx.Record{}, err
		}
	}
	rec, err := s.store.Get(r.Context(), rid)
	if errors.Is(err, failidx.ErrNotFound) {
		return rec, fmt.Errorf("record %d: %w", rid, err)
	}
	if errors.Is(rec.PayloadErr, seal.ErrTampered) {
		// A security event: said once per read, never with the payload.
		s.log.ErrorContext(r.Context(), "console: a sealed payload does not authenticate: changed or moved in the database",
			"record", rid, "key_id", rec.KeyID)
	}
	return rec, err
}

// payloadGone is the error of a request for a payload that cannot be read
// (the key destroyed, …): 410 Gone.
func payloadGone(rec failidx.Record) error {
	return &inputError{code: http.StatusGone, field: "id", msg: fmt.Sprintf("record %d: the value and headers cannot be read: %s", rec.ID, failidx.Unavailable(rec.PayloadErr))}
}

// audited checks that id may reveal record rid's payload and writes the
// audit row that says it did. It fails when the row cannot be written: no
// unaudited reveal.
func (s *server) audited(r *http.Request, id identity, rid int64) error {
	if id.Role < Operator {
		return &inputError{code: http.StatusForbidden, field: "reveal", msg: fmt.Sprintf("forbidden: showing unmasked payloads needs the operator role; %s is %s", id.Name, id.Role)}
	}
	if _, err := s.store.Get(r.Context(), rid); err != nil {
		return fmt.Errorf("record %d: %w", rid, err)
	}
	return s.store.WriteAudit(r.Context(), failidx.AuditEntry{
		At: s.cfg.now(), Actor: id.Name, Action: "reveal", RecordIDs: []int64{rid},
		Detail: "unmasked payload shown (" + r.Method + " " + r.URL.Path + ")", Result: "ok",
	})
}

// refuseGetReveal is the answer to a GET asking to reveal: it never
// reveals and never writes an audit row; revealing is a POST (with CSRF
// from a session).
func refuseGetReveal(r *http.Request) error {
	if v, _ := strconv.ParseBool(r.URL.Query().Get("reveal")); !v {
		return nil
	}
	return badInput("reveal", "a GET never reveals: POST %s/reveal (or POST …/value for the unmasked download), as an operator", strings.TrimSuffix(strings.TrimSuffix(r.URL.Path, "/value"), "/"))
}

func (s *server) apiRecord(w http.ResponseWriter, r *http.Request, id identity) {
	if err := refuseGetReveal(r); err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	s.apiShowRecord(w, r, id, false)
}

// apiRevealRecord serves POST /api/records/{id}/reveal: the record with its
// payload unmasked (audited).
func (s *server) apiRevealRecord(w http.ResponseWriter, r *http.Request, id identity) {
	s.apiShowRecord(w, r, id, true)
}

func (s *server) apiShowRecord(w http.ResponseWriter, r *http.Request, id identity, reveal bool) {
	rec, err := s.record(r, id, reveal)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, s.detailView(rec, reveal))
}

// apiValue sends a record's stored value as a download, masked; a value
// that cannot be masked is refused.
func (s *server) apiValue(w http.ResponseWriter, r *http.Request, id identity) {
	if err := refuseGetReveal(r); err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	s.value(w, r, id, true, false)
}

// apiRevealValue serves POST /api/records/{id}/value: the stored value
// unmasked (audited).
func (s *server) apiRevealValue(w http.ResponseWriter, r *http.Request, id identity) {
	s.value(w, r, id, true, true)
}

func (s *server) value(w http.ResponseWriter, r *http.Request, id identity, api, reveal bool) {
	rec, err := s.record(r, id, reveal)
	if err == nil && rec.PayloadErr != nil {
		err = payloadGone(rec)
	}
	if err != nil {
		s.fail(w, r, id, api, err)
		return
	}
	var sc *mask.Scrubber
	if !reveal {
		sc = s.mask.For(s.maskable(rec.Value)...)
	}
	p := s.payload(rec.Value, rec.ValueSize, rec.ValueTruncated, reveal, sc)
	if p.Hidden {
		s.fail(w, r, id, api, &inputError{code: http.StatusForbidden, field: "reveal",
			msg: "the value is not JSON and masking is on: only an operator may download it, revealed (POST)"})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="record-%d-value.bin"`, rec.ID))
	w.Header().Set("Content-Length", strconv.Itoa(len(p.raw)))
	_, _ = w.Write(p.raw)
}

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

type parkedView struct {
	Group  string    `json:"group"`
	Topic  string    `json:"topic"`
	Key    string    `json:"key"`
	Parked int       `json:"parked"`
	Head   string    `json:"head"`
	Since  time.Time `json:"since,omitzero"`
}

func (s *server) parked(r *http.Request) ([]parkedView, string, error) {
	limit, err := parseLimit(r.URL.Query().Get("limit"))
	if err != nil {
		return nil, "", err
	}
	ks, next, err := s.acts.ParkedKeys(r.Context(), r.URL.Query().Get("cursor"), limit)
	if err != nil {
		return nil, "", err
	}
	out := make([]parkedView, 0, len(ks))
	sc := s.mask.For() // card numbers only: no payload at hand
	for _, k := range ks {
		out = append(out, parkedView{Group: k.Group, Topic: k.Topic, Key: validText(sc.String(k.Key)), Parked: k.Parked, Head: sc.String(k.Head), Since: k.Since})
	}
	return out, next, nil
}

func (s *server) apiParked(w http.ResponseWriter, r *http.Request, id identity) {
	ks, next, err := s.parked(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"keys": ks, "next": next})
}

type releaseRequest struct {
	Group  string `json:"group"`
	Topic  string `json:"topic"`
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

func (s *server) release(r *http.Request, id identity, req releaseRequest) (failidx.Result, error) {
	switch {
	case strings.TrimSpace(req.Group) == "":
		return failidx.Result{}, badInput("group", "group is missing")
	case strings.TrimSpace(req.Topic) == "":
		return failidx.Result{}, badInput("topic", "topic is missing")
	case req.Key == "":
		return failidx.Result{}, badInput("key", "key is missing")
	case strings.TrimSpace(req.Reason) == "":
		return failidx.Result{}, badInput("reason", "releasing a parked key needs a reason")
	}
	return s.acts.ReleaseKey(r.Context(), id.Name, req.Group, req.Topic, req.Key, strings.TrimSpace(req.Reason))
}

func (s *server) apiRelease(w http.ResponseWriter, r *http.Request, id identity) {
	var req releaseRequest
	if err := decodeJSON(r, &req); err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	res, err := s.release(r, id, req)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, s.viewResult(res))
}

type outboxView struct {
	ID        int64     `json:"id"`
	Topic     string    `json:"topic"`
	Key       string    `json:"key"`
	Error     string    `json:"error"`
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"created_at"`
}

func (s *server) outbox(r *http.Request) ([]outboxView, error) {
	limit, err := parseLimit(r.URL.Query().Get("limit"))
	if err != nil {
		return nil, err
	}
	rows, err := s.acts.FailedOutbox(r.Context(), limit)
	if err != nil {
		return nil, err
	}
	out := make([]outboxView, 0, len(rows))
	sc := s.mask.For() // card numbers only: the outbox's payloads are not read
	for _, o := range rows {
		out = append(out, outboxView{ID: o.ID, Topic: o.Topic, Key: validText(sc.String(o.Key)),
			Error: validText(sc.String(o.Error)), Attempts: o.Attempts, CreatedAt: o.CreatedAt})
	}
	return out, nil
}

func (s *server) apiOutbox(w http.ResponseWriter, r *http.Request, id identity) {
	rows, err := s.outbox(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"rows": rows})
}

type outboxRetryRequest struct {
	IDs    []int64 `json:"ids"`
	Reason string  `json:"reason"`
}

func (s *server) retryOutbox(r *http.Request, id identity, req outboxRetryRequest) (failidx.Result, error) {
	if len(req.IDs) == 0 {
		return failidx.Result{}, badInput("ids", "no outbox rows selected")
	}
	return s.acts.RetryOutbox(r.Context(), id.Name, req.IDs, strings.TrimSpace(req.Reason))
}

func (s *server) apiOutboxRetry(w http.ResponseWriter, r *http.Request, id identity) {
	var req outboxRetryRequest
	if err := decodeJSON(r, &req); err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	res, err := s.retryOutbox(r, id, req)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, s.viewResult(res))
}

type auditView struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	Actor     string    `json:"actor"`
	Action    string    `json:"action"`
	RecordIDs []int64   `json:"record_ids"`
	Detail    string    `json:"detail"`
	Reason    string    `json:"reason"`
	Result    string    `json:"result"`
}

func (s *server) audit(r *http.Request) ([]auditView, string, error) {
	q := r.URL.Query()
	limit, err := parseLimit(q.Get("limit"))
	if err != nil {
		return nil, "", err
	}
	es, next, err := s.store.Audit(r.Context(), q.Get("cursor"), limit)
	if err != nil {
		return nil, "", err
	}
	out := make([]auditView, 0, len(es))
	sc := s.mask.For() // card numbers only: the audit holds no payload
	for _, e := range es {
		ids := e.RecordIDs
		if ids == nil {
			ids = []int64{}
		}
		out = append(out, auditView{ID: e.ID, At: e.At, Actor: e.Actor, Action: e.Action, RecordIDs: ids,
			Detail: sc.String(e.Detail), Reason: sc.String(e.Reason), Result: sc.String(e.Result)})
	}
	return out, next, nil
}

func (s *server) apiAudit(w http.ResponseWriter, r *http.Request, id identity) {
	es, next, err := s.audit(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"entries": es, "next": next})
}

func (s *server) apiWhoami(w http.ResponseWriter, _ *http.Request, id identity) {
	writeJSON200(w, http.StatusOK, map[string]string{"name": id.Name, "role": id.Role.String()})
}

func (s *server) apiOpenAPI(w http.ResponseWriter, _ *http.Request, _ identity) {
	w.Header().Set("Content-Type", "application/yaml; charset=utf-8")
	_, _ = w.Write(openapiYAML)
}
