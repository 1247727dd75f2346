package console

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/mask"
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
