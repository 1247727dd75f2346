package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/control"
)

// The live controls: the fleet (the members of each group, from their
// heartbeats), operator pauses, and re-drives of a window under a replay
// epoch (internal/control has the tables; consumer.Config.Controls makes a
// member obey them). Reading is for every role; pausing, resuming and
// re-driving are for admins only, each claimed in the statement that makes
// it and audited in its transaction; a refusal is audited too.

// partView is one partition of a group as the fleet shows it: its owner
// (a fresh member that claims it), lag and pause reasons, and the
// operator's pause that holds it, if any.
type partView struct {
	Topic     string         `json:"topic"`
	Partition int32          `json:"partition"`
	Owner     string         `json:"owner,omitempty"`
	Lag       int64          `json:"lag"`
	Paused    []string       `json:"paused"`
	Pause     *control.Pause `json:"pause,omitempty"`
	Redrive   int64          `json:"redrive,omitempty"`
}

// fleetGroup is one consumer group of the fleet.
type fleetGroup struct {
	Group      string           `json:"group"`
	Members    []control.Member `json:"members"`
	Pauses     []control.Pause  `json:"pauses"`
	Partitions []partView       `json:"partitions"`
	// Topics are the topics its fresh members claim partitions of, or that
	// a pause names, for the topic-wide pause buttons.
	Topics []string `json:"topics"`
}

// fleet reads the members and pauses of every group (or of ?group=).
func (s *server) fleet(r *http.Request) ([]fleetGroup, error) {
	group := r.URL.Query().Get("group")
	ms, err := s.ctl.Fleet(r.Context(), group)
	if err != nil {
		return nil, err
	}
	ps, err := s.ctl.Pauses(r.Context(), group)
	if err != nil {
		return nil, err
	}
	byGroup := map[string]*fleetGroup{}
	get := func(g string) *fleetGroup {
		if byGroup[g] == nil {
			byGroup[g] = &fleetGroup{Group: g, Members: []control.Member{}, Pauses: []control.Pause{}, Partitions: []partView{}}
		}
		return byGroup[g]
	}
	for _, m := range ms {
		fg := get(m.Group)
		fg.Members = append(fg.Members, m)
		if m.Stale {
			continue
		}
		for _, p := range m.Status.Partitions {
			fg.Partitions = append(fg.Partitions, partView{Topic: p.Topic, Partition: p.Partition, Owner: m.ID, Lag: p.Lag,
				Paused: nonNil(p.Paused), Redrive: p.Redrive})
		}
	}
	for _, p := range ps {
		get(p.Group).Pauses = append(get(p.Group).Pauses, p)
	}
	out := make([]fleetGroup, 0, len(byGroup))
	for _, fg := range byGroup {
		st := control.State{Pauses: fg.Pauses}
		topics := map[string]bool{}
		for i := range fg.Partitions {
			pv := &fg.Partitions[i]
			if p, ok := st.Paused(pv.Topic, pv.Partition); ok {
				pv.Pause = &p
			}
			topics[pv.Topic] = true
		}
		for _, p := range fg.Pauses { // a paused partition no fresh member claims
			topics[p.Topic] = true
			if p.Partition != control.AllPartitions && !slices.ContainsFunc(fg.Partitions, func(v partView) bool { return v.Topic == p.Topic && v.Partition == p.Partition }) {
				fg.Partitions = append(fg.Partitions, partView{Topic: p.Topic, Partition: p.Partition, Lag: -1, Paused: []string{}, Pause: &p})
			}
		}
		slices.SortFunc(fg.Partitions, func(a, b partView) int {
			if c := strings.Compare(a.Topic, b.Topic); c != 0 {
				return c
			}
			return int(a.Partition - b.Partition)
		})
		for t := range topics {
			fg.Topics = append(fg.Topics, t)
		}
		slices.Sort(fg.Topics)
		out = append(out, *fg)
	}
	slices.SortFunc(out, func(a, b fleetGroup) int { return strings.Compare(a.Group, b.Group) })
	return out, nil
}

func (s *server) apiFleet(w http.ResponseWriter, r *http.Request, id identity) {
	gs, err := s.fleet(r)
	if err != nil {
		s.fail(w, r, id, true, controlErr(err))
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"groups": gs, "stale_after_beats": control.StaleBeats})
}

func (s *server) uiFleet(w http.ResponseWriter, r *http.Request, id identity) {
	gs, err := s.fleet(r)
	if err != nil {
		s.fail(w, r, id, false, controlErr(err))
		return
	}
	s.render(w, r, id, http.StatusOK, "fleet", "Fleet", "fleet", map[string]any{"Groups": gs, "StaleBeats": control.StaleBeats})
}

// controlErr turns an error of the live controls into the console's input
// error (so that the refusal is audited), or returns it as it is.
func controlErr(err error) error {
	var ie *control.InputError
	var re *control.RateError
	switch {
	case errors.As(err, &ie):
		return &inputError{code: http.StatusBadRequest, field: ie.Field, msg: ie.Error()}
	case errors.As(err, &re):
		return &inputError{code: http.StatusTooManyRequests, field: "group", msg: re.Error(), retryAfter: re.RetryAfter}
	case errors.Is(err, control.ErrConflict):
		return &inputError{code: http.StatusConflict, msg: err.Error()}
	case errors.Is(err, control.ErrNotFound):
		return &inputError{code: http.StatusNotFound, field: "id", msg: err.Error()}
	case control.MissingTables(err):
		return &inputError{code: http.StatusServiceUnavailable,
			msg: "this database has no live controls' tables (idem_control_*): run idem migrate, or idem.Migrate, on it"}
	}
	return err
}

// pauseRequest is the body of POST /api/pauses and /api/pauses/resume.
type pauseRequest struct {
	Group string `json:"group"`
	Topic string `json:"topic"`
	// Partition is one partition; absent (null) pauses the whole topic.
	Partition *int32 `json:"partition"`
	Reason    string `json:"reason"`
}

func (p pauseRequest) pause() control.Pause {
	part := control.AllPartitions
	if p.Partition != nil {
		part = *p.Partition
	}
	return control.Pause{Group: strings.TrimSpace(p.Group), Topic: strings.TrimSpace(p.Topic), Partition: part, Reason: p.Reason}
}

// setPause pauses (on) or resumes what req names, as id.
func (s *server) setPause(r *http.Request, id identity, req pauseRequest, on bool) (map[string]any, error) {
	p := req.pause()
	if !on {
		got, err := s.ctl.Resume(r.Context(), id.Name, p)
		if err != nil {
			return nil, controlErr(err)
		}
		out := map[string]any{"resumed": got}
		if p.Partition != control.AllPartitions {
			ps, err := s.ctl.Pauses(r.Context(), p.Group)
			if err == nil {
				if still, ok := (control.State{Pauses: ps}).Paused(p.Topic, p.Partition); ok {
					out["warning"] = fmt.Sprintf("%s stays paused: its topic is paused (by %s)", p.What(), still.By)
				}
			}
		}
		return out, nil
	}
	got, err := s.ctl.Pause(r.Context(), id.Name, p)
	if err != nil {
		return nil, controlErr(err)
	}
	out := map[string]any{"pause": got}
	if w := s.ctl.Unwatched(r.Context(), p.Group); w != "" {
		out["warning"] = w
	}
	return out, nil
}

func (s *server) apiSetPause(on bool) func(w http.ResponseWriter, r *http.Request, id identity) {
	return func(w http.ResponseWriter, r *http.Request, id identity) {
		var req pauseRequest
		if err := decodeJSON(r, &req); err != nil {
			s.fail(w, r, id, true, err)
			return
		}
		out, err := s.setPause(r, id, req, on)
		if err != nil {
			s.fail(w, r, id, true, err)
			return
		}
		writeJSON200(w, http.StatusOK, out)
	}
}

func (s *server) apiPauses(w http.ResponseWriter, r *http.Request, id identity) {
	ps, err := s.ctl.Pauses(r.Context(), r.URL.Query().Get("group"))
	if err != nil {
		s.fail(w, r, id, true, controlErr(err))
		return
	}
	writeJSON200(w, http.StatusOK, map[string]any{"pauses": nonNil(ps)})
}

// uiSetPause is the pause toggle's form: group, topic, partition ("" for
// the whole topic), reason; then back to the page it came from.
func (s *server) uiSetPause(on bool) func(w http.ResponseWriter, r *http.Request, id identity) {
	return func(w http.ResponseWriter, r *http.Request, id identity) {
		req := pauseRequest{Group: r.PostFormValue("group"), Topic: r.PostFormValue("topic"), Reason: r.PostFormValue("reason")}
		if v := strings.TrimSpace(r.PostFormValue("partition")); v != "" {
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil {
				s.fail(w, r, id, false, badInput("partition", "partition %q is not a number", v))
				return
			}
			p := int32(n)
			req.Partition = &p
		}
		if _, err := s.setPause(r, id, req, on); err != nil {
			s.fail(w, r, id, false, err)
			return
		}
		http.Redirect(w, r, s.back(r.PostFormValue("back")), http.StatusSeeOther)
	}
}

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

// toggle is the pause toggle of a topic (partition -1) or a partition on
// the fleet page.
type toggle struct {
	CSRF, Group, Topic string
	Partition          int32
	// Paused: a pause of exactly this (the topic's own, the partition's
	// own) exists, and the toggle resumes it.
	Paused bool
}

func toggleOf(p pageData, group, topic string, partition int32, pauses []control.Pause) toggle {
	t := toggle{CSRF: p.CSRF, Group: group, Topic: topic, Partition: partition}
	for _, x := range pauses {
		if x.Topic == topic && x.Partition == partition {
			t.Paused = true
		}
	}
	return t
}

// progressOf is a re-drive's progress, as the list shows it.
func progressOf(r control.Redrive) string {
	total, done := r.Offsets()
	if total == 0 {
		return "0 of 0"
	}
	return fmt.Sprintf("%d of %d (%d%%)", done, total, done*100/total)
}

// liveControls is what the overview shows of the live controls: the
// pauses, and the re-drives running.
type liveControls struct {
	Pauses   []control.Pause   `json:"pauses"`
	Redrives []control.Redrive `json:"redrives_running"`
}

func (s *server) liveControls(ctx context.Context) (liveControls, error) {
	out := liveControls{Pauses: []control.Pause{}, Redrives: []control.Redrive{}}
	ps, err := s.ctl.Pauses(ctx, "")
	if control.MissingTables(err) { // a database without them: nothing to show
		return out, nil
	}
	if err != nil {
		return liveControls{}, err
	}
	rs, err := s.ctl.RunningRedrives(ctx)
	if err != nil {
		return liveControls{}, err
	}
	out.Pauses, out.Redrives = nonNil(ps), nonNil(rs)
	return out, nil
}
