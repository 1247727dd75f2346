package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/failidx"
)

// refuse answers a request for rt refused with err (a 4xx) and, when rt is
// an action, audits the refusal.
func (s *server) refuse(w http.ResponseWriter, r *http.Request, id identity, rt route, err *inputError) {
	s.auditRefusal(r, id, rt, err)
	if rt.api {
		s.apiError(w, err.code, err.msg, err.field, "")
	} else {
		s.uiError(w, r, id, err.code, err.msg)
	}
}

// auditRefusal writes the audit row of an action request refused with
// err: who asked, for what, and why not.
func (s *server) auditRefusal(r *http.Request, id identity, rt route, err *inputError) {
	action := rt.action
	switch action {
	case "":
		return
	case "*":
		if action = r.PathValue("action"); action == "" {
			action = r.PostFormValue("action")
		}
		if action == "" {
			action = "action"
		}
	}
	actor := id.Name
	if actor == "" {
		actor = "unknown"
	}
	var ids []int64
	if rid, perr := strconv.ParseInt(r.PathValue("id"), 10, 64); perr == nil && rid > 0 && !strings.Contains(rt.path, "/jobs/") {
		ids = []int64{rid}
	}
	e := failidx.AuditEntry{Actor: actor, Action: action, RecordIDs: ids, Detail: r.Method + " " + r.URL.Path,
		Result: fmt.Sprintf("rejected %d: %s", err.code, err.msg)}
	if aerr := s.store.WriteAudit(context.WithoutCancel(r.Context()), e); aerr != nil {
		s.log.ErrorContext(r.Context(), "console: audit a refused action", "action", action, "actor", actor, "err", aerr)
	}
}

// apiError writes {"error": msg, "field": field} (and "id" for an internal
// error).
func (s *server) apiError(w http.ResponseWriter, code int, msg, field, errID string) {
	body := map[string]string{"error": msg, "field": field}
	if errID != "" {
		body["id"] = errID
	}
	writeJSON200(w, code, body)
}

func writeJSON200(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// errorStatus maps an error of the index to an HTTP status and a message
// the caller can act on; field names the input at fault, when known.
// Anything else is an internal error: 500, and the message is for the log.
func errorStatus(err error) (code int, msg, field string) {
	var ve *failidx.ValidationError
	switch {
	case errors.As(err, &ve):
		return http.StatusBadRequest, ve.Error(), ve.Field
	case errors.Is(err, dlq.ErrUnknownTopic):
		return http.StatusBadRequest, err.Error(), "to"
	case errors.Is(err, failidx.ErrNotFound):
		return http.StatusNotFound, err.Error(), ""
	case errors.Is(err, failidx.ErrConflict):
		return http.StatusConflict, err.Error(), ""
	}
	var ie *inputError
	if errors.As(err, &ie) {
		return ie.code, ie.msg, ie.field
	}
	return http.StatusInternalServerError, err.Error(), ""
}

// inputError is bad input the console itself found.
type inputError struct {
	code       int
	field, msg string
	retryAfter time.Duration // a 429's Retry-After
}

func (e *inputError) Error() string { return e.msg }

func badInput(field, format string, args ...any) error {
	return &inputError{code: http.StatusBadRequest, field: field, msg: fmt.Sprintf(format, args...)}
}

// fail writes err as the API's or the UI's error response. An internal
// error goes to the log with an id, and the client gets only the id. A
// request for an action that the console itself refused (bad input, the
// role) is audited; the index audits what it refuses.
func (s *server) fail(w http.ResponseWriter, r *http.Request, id identity, api bool, err error) {
	code, msg, field := errorStatus(err)
	errID := ""
	ie := (*inputError)(nil)
	if code >= 500 && !errors.As(err, &ie) { // a 5xx the console states itself (503) says what to do
		errID = nonce()[:12]
		s.log.ErrorContext(r.Context(), "console: request failed", "id", errID, "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error " + errID + ": the console's log has the details under this id"
	} else if errors.As(err, &ie) {
		if rt, ok := r.Context().Value(routeKey{}).(route); ok {
			s.auditRefusal(r, id, rt, ie)
		}
		if ie.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(max(ie.retryAfter.Seconds(), 1))))
		}
	}
	if api {
		s.apiError(w, code, msg, field, errID)
		return
	}
	s.uiError(w, r, id, code, msg)
}
