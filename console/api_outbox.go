package console

import (
	"net/http"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/failidx"
)

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
