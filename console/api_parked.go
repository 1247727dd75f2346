package console

import (
	"net/http"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/failidx"
)

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
