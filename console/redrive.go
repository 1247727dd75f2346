package console

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/control"
)

// redriveRequest is the body of POST /api/redrives.
type redriveRequest struct {
	Group string `json:"group"`
	Topic string `json:"topic"`
	// Partition is one partition; absent: every partition.
	Partition *int32 `json:"partition"`
	// From is the window's start: an RFC 3339 time, or a duration that
	// long ago ("1h"). Or FromOffset, with a partition.
	From       string `json:"from"`
	FromOffset *int64 `json:"from_offset"`
	// Until is the window's end (same forms); "": the end at the request.
	Until  string `json:"until"`
	Epoch  int64  `json:"epoch"`
	Rate   int    `json:"rate"`
	Reason string `json:"reason"`
	DryRun bool   `json:"dry_run"`
}

func (b redriveRequest) request(now time.Time) (control.RedriveRequest, error) {
	req := control.RedriveRequest{Group: strings.TrimSpace(b.Group), Topic: strings.TrimSpace(b.Topic), Partition: control.AllPartitions,
		FromOffset: -1, Epoch: b.Epoch, Rate: b.Rate, Reason: strings.TrimSpace(b.Reason)}
	if b.Partition != nil {
		req.Partition = *b.Partition
	}
	if b.FromOffset != nil {
		req.FromOffset = *b.FromOffset
		if req.FromOffset < 0 {
			return req, badInput("from_offset", "from_offset %d is negative", req.FromOffset)
		}
	}
	var err error
	if req.From, err = control.ParseWhen(b.From, now); err != nil {
		return req, badInput("from", "from %v", err)
	}
	if req.Until, err = control.ParseWhen(b.Until, now); err != nil {
		return req, badInput("until", "until %v", err)
	}
	return req, nil
}

// redriveOutcome is what a re-drive request answers.
type redriveOutcome struct {
	DryRun  bool            `json:"dry_run"`
	Redrive control.Redrive `json:"redrive"`
	// Offsets is the window's size: its records (a transactional topic's
	// commit markers take offsets too).
	Offsets int64  `json:"offsets"`
	Warning string `json:"warning,omitempty"`
}

// redrive plans (dry run) or starts the re-drive b asks for, as id.
func (s *server) redrive(r *http.Request, id identity, b redriveRequest) (redriveOutcome, error) {
	req, err := b.request(s.cfg.now())
	if err != nil {
		return redriveOutcome{}, err
	}
	if req.Group == "" || req.Topic == "" || (req.From.IsZero() && req.FromOffset < 0) {
		return redriveOutcome{}, controlErr(req.Check())
	}
	parts, err := control.Window(r.Context(), s.cfg.Client, req)
	if err != nil {
		return redriveOutcome{}, controlErr(err)
	}
	var rd control.Redrive
	if b.DryRun {
		rd, err = s.ctl.Plan(r.Context(), id.Name, req, parts)
	} else {
		rd, err = s.ctl.StartRedrive(r.Context(), id.Name, req, parts)
	}
	if err != nil {
		return redriveOutcome{}, controlErr(err)
	}
	total, _ := rd.Offsets()
	return redriveOutcome{DryRun: b.DryRun, Redrive: rd, Offsets: total, Warning: s.ctl.Unwatched(r.Context(), req.Group)}, nil
}

func (s *server) apiRedrive(w http.ResponseWriter, r *http.Request, id identity) {
	var b redriveRequest
	if err := decodeJSON(r, &b); err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	out, err := s.redrive(r, id, b)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	code := http.StatusCreated
	if out.DryRun {
		code = http.StatusOK
	} else {
		w.Header().Set("Location", fmt.Sprintf("%s/api/redrives/%d", s.cfg.BasePath, out.Redrive.ID))
	}
	writeJSON200(w, code, out)
}

func (s *server) redrives(r *http.Request) ([]control.Redrive, error) {
	limit, err := parseLimit(r.URL.Query().Get("limit"))
	if err != nil {
		return nil, err
	}
	rs, err := s.ctl.Redrives(r.Context(), r.URL.Query().Get("group"), limit)
	return rs, controlErr(err)
}

func (s *server) apiRedrives(w http.ResponseWriter, r *http.Request, id identity) {
	rs, err := s.redrives(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"redrives": nonNil(rs)})
}

// redriveOf reads the re-drive of the path's id.
func (s *server) redriveOf(r *http.Request) (control.Redrive, error) {
	rid, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || rid <= 0 {
		return control.Redrive{}, &inputError{code: http.StatusNotFound, field: "id", msg: fmt.Sprintf("re-drive %q: no such re-drive", r.PathValue("id"))}
	}
	rd, err := s.ctl.Redrive(r.Context(), rid)
	return rd, controlErr(err)
}

func (s *server) apiRedriveOne(w http.ResponseWriter, r *http.Request, id identity) {
	rd, err := s.redriveOf(r)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, rd)
}

// cancelRedrive cancels the path's re-drive, as id.
func (s *server) cancelRedrive(r *http.Request, id identity, reason string) (control.Redrive, error) {
	rd, err := s.redriveOf(r)
	if err != nil {
		return rd, err
	}
	rd, err = s.ctl.CancelRedrive(r.Context(), id.Name, rd.ID, reason)
	return rd, controlErr(err)
}

func (s *server) apiCancelRedrive(w http.ResponseWriter, r *http.Request, id identity) {
	var b struct {
		Reason string `json:"reason"`
	}
	if err := decodeJSON(r, &b); err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	rd, err := s.cancelRedrive(r, id, b.Reason)
	if err != nil {
		s.fail(w, r, id, true, err)
		return
	}
	writeJSON200(w, http.StatusOK, rd)
}

// redriveForm reads the re-drive form of the UI.
func redriveForm(r *http.Request) (redriveRequest, error) {
	f := func(k string) string { return strings.TrimSpace(r.PostFormValue(k)) }
	b := redriveRequest{Group: f("group"), Topic: f("topic"), From: f("from"), Until: f("until"), Reason: f("reason"), DryRun: f("dry_run") != ""}
	num := func(field string, bits int) (*int64, error) {
		v := f(field)
		if v == "" {
			return nil, nil
		}
		n, err := strconv.ParseInt(v, 10, bits)
		if err != nil {
			return nil, badInput(field, "%s %q is not a number", field, v)
		}
		return &n, nil
	}
	var err error
	var p, off, epoch, rate *int64
	if p, err = num("partition", 32); err != nil {
		return b, err
	}
	if p != nil {
		v := int32(*p)
		b.Partition = &v
	}
	if off, err = num("from_offset", 64); err != nil {
		return b, err
	}
	b.FromOffset = off
	if epoch, err = num("epoch", 64); err != nil {
		return b, err
	}
	if epoch != nil {
		b.Epoch = *epoch
	}
	if rate, err = num("rate", 32); err != nil {
		return b, err
	}
	if rate != nil {
		b.Rate = int(*rate)
	}
	return b, nil
}

func (s *server) uiRedrives(w http.ResponseWriter, r *http.Request, id identity) {
	rs, err := s.redrives(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.render(w, r, id, http.StatusOK, "redrives", "Re-drives", "redrives", map[string]any{"Redrives": rs, "Form": redriveRequest{From: "1h"}})
}

// uiRedrive runs the re-drive form: a dry run shows the window and its
// count with a button that starts it; a start goes to the re-drive's page.
func (s *server) uiRedrive(w http.ResponseWriter, r *http.Request, id identity) {
	b, err := redriveForm(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	out, err := s.redrive(r, id, b)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	if out.DryRun {
		if !out.Redrive.From.IsZero() { // the confirmation starts where the count did
			b.From = out.Redrive.From.UTC().Format(time.RFC3339Nano)
		}
		s.render(w, r, id, http.StatusOK, "redriveplan", "Re-drive: dry run", "redrives", map[string]any{"Outcome": out, "Form": b})
		return
	}
	http.Redirect(w, r, fmt.Sprintf("%s/redrives/%d", s.cfg.BasePath, out.Redrive.ID), http.StatusSeeOther)
}

func (s *server) uiRedriveOne(w http.ResponseWriter, r *http.Request, id identity) {
	rd, err := s.redriveOf(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	total, done := rd.Offsets()
	s.render(w, r, id, http.StatusOK, "redrive", fmt.Sprintf("Re-drive %d", rd.ID), "redrives", map[string]any{"Redrive": rd, "Total": total, "Done": done})
}

func (s *server) uiCancelRedrive(w http.ResponseWriter, r *http.Request, id identity) {
	rd, err := s.cancelRedrive(r, id, r.PostFormValue("reason"))
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	http.Redirect(w, r, fmt.Sprintf("%s/redrives/%d", s.cfg.BasePath, rd.ID), http.StatusSeeOther)
}

// progressOf is a re-drive's progress, as the list shows it.
func progressOf(r control.Redrive) string {
	total, done := r.Offsets()
	if total == 0 {
		return "0 of 0"
	}
	return fmt.Sprintf("%d of %d (%d%%)", done, total, done*100/total)
}
