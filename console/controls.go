package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

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
