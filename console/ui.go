package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/failidx"
)

//go:embed templates
var templateFS embed.FS

// pageNames are the templates under templates/, each rendered inside
// layout.html.
var pageNames = []string{"overview", "groups", "records", "record", "edit", "result", "parked", "outbox", "audit", "login", "error", "jobs", "job",
	"fleet", "redrives", "redrive", "redriveplan"}

func parsePages(base string) (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"base": func() string { return base },
		"ago":  ago,
		"time": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"ids": func(ids []int64) string {
			s := make([]string, len(ids))
			for i, id := range ids {
				s[i] = strconv.FormatInt(id, 10)
			}
			return strings.Join(s, ", ")
		},
		"bytes": humanBytes,
		"query": func(v url.Values, kv ...string) string {
			q := url.Values{}
			for k, vs := range v {
				q[k] = vs
			}
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i+1] == "" {
					q.Del(kv[i])
				} else {
					q.Set(kv[i], kv[i+1])
				}
			}
			return q.Encode()
		},
		"statuses": func() []string { return []string{"unresolved", "replaying", "replayed", "resolved", "archived"} },
		"toggle":   toggleOf,
		"progress": progressOf,
		"statusIs": func(f failidx.Filter, s string) bool {
			for _, st := range f.Status {
				if string(st) == s {
					return true
				}
			}
			return s == "" && len(f.Status) == 0
		},
	}
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := time.Since(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

func humanBytes(n int) string {
	switch {
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// pageData is what every page template gets.
type pageData struct {
	Title    string
	Nav      string
	User     string
	Role     Role
	CSRF     string
	Insecure bool
	Masking  bool
	Data     any
}

// Operator and Admin tell templates which controls to show; the server
// checks again on every request.
func (p pageData) Operator() bool { return p.Role >= Operator }

// Admin reports whether the user may act on whole groups.
func (p pageData) Admin() bool { return p.Role >= Admin }

// render writes page name with data.
func (s *server) render(w http.ResponseWriter, r *http.Request, id identity, code int, name, title, nav string, data any) {
	p := pageData{Title: title, Nav: nav, User: id.Name, Role: id.Role, CSRF: s.auth.csrf(id),
		Insecure: s.cfg.InsecureNoAuth, Masking: s.mask.Active(), Data: data}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if err := s.pages[name].Execute(w, p); err != nil {
		s.log.ErrorContext(r.Context(), "console: render", "page", name, "err", err)
	}
}

func (s *server) uiError(w http.ResponseWriter, r *http.Request, id identity, code int, msg string) {
	s.render(w, r, id, code, "error", http.StatusText(code), "", map[string]any{"Code": code, "Message": msg})
}

func (s *server) uiOverview(w http.ResponseWriter, r *http.Request, id identity) {
	ts, err := s.overview(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	lc, err := s.liveControls(r.Context())
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.render(w, r, id, http.StatusOK, "overview", "Overview", "overview", map[string]any{"Topics": ts, "Controls": lc})
}

func (s *server) uiGroups(w http.ResponseWriter, r *http.Request, id identity) {
	gs, f, err := s.groups(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.render(w, r, id, http.StatusOK, "groups", "Failure groups", "groups", map[string]any{"Groups": gs, "Filter": f})
}

func (s *server) uiRecords(w http.ResponseWriter, r *http.Request, id identity) {
	recs, next, f, err := s.list(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	q := filterValues(f)
	if l := r.URL.Query().Get("limit"); l != "" {
		q.Set("limit", l)
	}
	s.render(w, r, id, http.StatusOK, "records", "Records", "records", map[string]any{
		"Records": recs, "Next": next, "Filter": f, "Query": q, "Paged": r.URL.Query().Get("cursor") != "",
	})
}

func (s *server) showRecord(w http.ResponseWriter, r *http.Request, id identity, reveal bool) {
	rec, err := s.record(r, id, reveal)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.render(w, r, id, http.StatusOK, "record", fmt.Sprintf("Record %d", rec.ID), "records", s.detailView(rec, reveal))
}

func (s *server) uiRecord(w http.ResponseWriter, r *http.Request, id identity) {
	s.showRecord(w, r, id, false)
}

// uiReveal shows the record with its payload unmasked (audited).
func (s *server) uiReveal(w http.ResponseWriter, r *http.Request, id identity) {
	s.showRecord(w, r, id, true)
}

func (s *server) uiValue(w http.ResponseWriter, r *http.Request, id identity) {
	s.value(w, r, id, false, false)
}

func (s *server) uiRevealValue(w http.ResponseWriter, r *http.Request, id identity) {
	s.value(w, r, id, false, true)
}

// uiEdit shows the edit-and-retry form, filled with the record's value
// (unmasked: audited as a reveal when masking is on).
func (s *server) uiEdit(w http.ResponseWriter, r *http.Request, id identity) {
	rec, err := s.record(r, id, s.mask.Active())
	if err == nil && rec.PayloadErr != nil {
		err = payloadGone(rec)
	}
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.renderEdit(w, r, id, http.StatusOK, rec, string(rec.Value), "", "")
}

func (s *server) renderEdit(w http.ResponseWriter, r *http.Request, id identity, code int, rec failidx.Record, value, reason, problem string) {
	value = strings.ToValidUTF8(value, "\uFFFD")
	if json.Valid([]byte(value)) {
		if pretty, err := indentJSON([]byte(value)); err == nil {
			value = string(pretty)
		}
	}
	s.render(w, r, id, code, "edit", fmt.Sprintf("Edit and retry record %d", rec.ID), "records", map[string]any{
		"Record": baseView(rec, nil), "Value": value, "Reason": reason, "Problem": problem,
		"JSON": json.Valid(rec.Value), "Truncated": rec.ValueTruncated, "Stub": rec.Stub,
	})
}

func (s *server) uiEditRetry(w http.ResponseWriter, r *http.Request, id identity) {
	rid, err := pathID(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	value, reason := r.PostFormValue("value"), r.PostFormValue("reason")
	res, job, err := s.editRetry(r, id, rid, &value, reason)
	if err != nil {
		code, msg, field := errorStatus(err)
		if code == http.StatusBadRequest && field != "" {
			rec, gerr := s.store.Get(r.Context(), rid)
			if gerr == nil {
				s.renderEdit(w, r, id, code, rec, value, reason, msg)
				return
			}
		}
		s.fail(w, r, id, false, err)
		return
	}
	s.renderOutcome(w, r, id, "Edit and retry", res, job, fmt.Sprintf("%s/records/%d", s.cfg.BasePath, rid))
}

func (s *server) renderResult(w http.ResponseWriter, r *http.Request, id identity, what string, res failidx.Result, back string) {
	s.render(w, r, id, http.StatusOK, "result", what, "", map[string]any{"What": what, "Result": s.viewResult(res), "Back": back})
}

// renderOutcome shows an action's result, or, for a job still running,
// sends the browser to the job's page.
func (s *server) renderOutcome(w http.ResponseWriter, r *http.Request, id identity, what string, res failidx.Result, job *failidx.Job, back string) {
	if job != nil && !job.Finished() {
		http.Redirect(w, r, fmt.Sprintf("%s/jobs/%d", s.cfg.BasePath, job.ID), http.StatusSeeOther)
		return
	}
	s.renderResult(w, r, id, what, res, back)
}

// uiAction runs replay, resolve or archive from a form: the records ticked
// (ids), or with scope=filter every record matching the form's filter
// fields (a failure-group row: fingerprint, kind, group and topic; admin).
func (s *server) uiAction(w http.ResponseWriter, r *http.Request, id identity) {
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, id, false, badInput("body", "bad form: %v", err))
		return
	}
	f := r.PostForm
	ids, err := formIDs(f["ids"])
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	var fb *filterBody
	if f.Get("scope") == "filter" {
		fb = &filterBody{Group: f.Get("group"), Topic: f.Get("topic"), Kind: f.Get("kind"), Fingerprint: f.Get("fingerprint"),
			Key: f.Get("key"), Error: f.Get("error"), Status: f["status"], Since: f.Get("since"), Until: f.Get("until")}
		ids = nil
	}
	sel, err := s.selection(id, ids, fb, false)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	rate := 0
	if v := strings.TrimSpace(f.Get("rate")); v != "" {
		if rate, err = strconv.Atoi(v); err != nil {
			s.fail(w, r, id, false, badInput("rate", "rate %q is not a number", v))
			return
		}
	}
	action := f.Get("action")
	res, job, err := s.act(r, id, action, sel, f.Get("to"), rate, f.Get("reason"))
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.renderOutcome(w, r, id, strings.ToUpper(action[:1])+action[1:], res, job, s.back(f.Get("back")))
}

// formIDs reads the ids a form's ticked boxes posted.
func formIDs(vs []string) ([]int64, error) {
	var ids []int64
	for _, v := range vs {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, badInput("ids", "id %q is not a number", v)
		}
		ids = append(ids, n)
	}
	return ids, nil
}

// back returns a local page to go back to: b when it is a path of this
// console (never another site's), else the overview.
func (s *server) back(b string) string {
	if u, err := url.Parse(b); err == nil && u.Scheme == "" && u.Host == "" && u.Opaque == "" &&
		strings.HasPrefix(u.Path, s.cfg.BasePath+"/") && !strings.HasPrefix(b, "//") && !strings.Contains(b, "\\") {
		return u.RequestURI()
	}
	return s.cfg.BasePath + "/"
}

func (s *server) uiParked(w http.ResponseWriter, r *http.Request, id identity) {
	ks, next, err := s.parked(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.render(w, r, id, http.StatusOK, "parked", "Parked keys", "parked", map[string]any{"Keys": ks, "Next": next})
}

func (s *server) uiRelease(w http.ResponseWriter, r *http.Request, id identity) {
	req := releaseRequest{Group: r.PostFormValue("group"), Topic: r.PostFormValue("topic"), Key: r.PostFormValue("key"), Reason: r.PostFormValue("reason")}
	res, err := s.release(r, id, req)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.renderResult(w, r, id, "Release parked key", res, s.cfg.BasePath+"/parked-keys")
}

func (s *server) uiOutbox(w http.ResponseWriter, r *http.Request, id identity) {
	rows, err := s.outbox(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.render(w, r, id, http.StatusOK, "outbox", "Failed outbox rows", "outbox", rows)
}

func (s *server) uiOutboxRetry(w http.ResponseWriter, r *http.Request, id identity) {
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, id, false, badInput("body", "bad form: %v", err))
		return
	}
	ids, err := formIDs(r.PostForm["ids"])
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	res, err := s.retryOutbox(r, id, outboxRetryRequest{IDs: ids, Reason: r.PostForm.Get("reason")})
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.renderResult(w, r, id, "Retry outbox rows", res, s.cfg.BasePath+"/outbox")
}

func (s *server) uiAudit(w http.ResponseWriter, r *http.Request, id identity) {
	es, next, err := s.audit(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.render(w, r, id, http.StatusOK, "audit", "Audit log", "audit", map[string]any{"Entries": es, "Next": next})
}

func (s *server) loginPage(w http.ResponseWriter, r *http.Request, id identity) {
	s.renderLogin(w, r, http.StatusOK, "")
}

func (s *server) renderLogin(w http.ResponseWriter, r *http.Request, code int, problem string) {
	next := r.FormValue("next")
	s.render(w, r, identity{}, code, "login", "Log in", "", map[string]any{
		"Token": s.auth.loginNonce(w, r), "Next": next, "Problem": problem, "Insecure": s.cfg.InsecureNoAuth,
	})
}

func (s *server) uiJobs(w http.ResponseWriter, r *http.Request, id identity) {
	js, next, err := s.jobs(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.render(w, r, id, http.StatusOK, "jobs", "Jobs", "jobs", map[string]any{"Jobs": js, "Next": next})
}

func (s *server) uiJob(w http.ResponseWriter, r *http.Request, id identity) {
	j, err := s.job(r)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	s.render(w, r, id, http.StatusOK, "job", fmt.Sprintf("Job %d", j.ID), "jobs", s.viewJob(j))
}

func (s *server) uiCancelJob(w http.ResponseWriter, r *http.Request, id identity) {
	j, err := s.cancelJob(r, id)
	if err != nil {
		s.fail(w, r, id, false, err)
		return
	}
	http.Redirect(w, r, fmt.Sprintf("%s/jobs/%d", s.cfg.BasePath, j.ID), http.StatusSeeOther)
}

// login checks a login form: its body is capped before it is parsed, and
// an address that spent its budget of attempts gets 429.
func (s *server) login(w http.ResponseWriter, r *http.Request, _ identity) {
	if !s.auth.limits.spend(clientAddr(r, s.cfg.BehindProxy)) {
		w.Header().Set("Retry-After", strconv.Itoa(int(loginRefill.Seconds())))
		s.renderLogin(w, r, http.StatusTooManyRequests, "Too many attempts from your address: wait a minute.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, loginBodyBytes)
	if err := r.ParseForm(); err != nil {
		code := http.StatusBadRequest
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			code = http.StatusRequestEntityTooLarge
		}
		w.Header().Set("Connection", "close")
		http.Error(w, "bad login form: "+err.Error(), code)
		return
	}
	if !s.auth.checkLogin(r) {
		s.renderLogin(w, r, http.StatusForbidden, "The login form expired: try again.")
		return
	}
	t, ok := s.auth.token(strings.TrimSpace(r.PostFormValue("token")))
	if !ok {
		s.renderLogin(w, r, http.StatusUnauthorized, "Unknown token.")
		return
	}
	v, err := s.auth.newSession(r.Context(), identity{Name: t.Name, Role: t.Role})
	if err != nil {
		s.fail(w, r, identity{}, false, err)
		return
	}
	s.auth.setSession(w, v, int(s.cfg.SessionTTL.Seconds()))
	http.Redirect(w, r, s.back(r.PostFormValue("next")), http.StatusSeeOther)
}

// logout revokes the session on the server side, so its cookie is no good
// afterwards even if copied, and clears it in the browser.
func (s *server) logout(w http.ResponseWriter, r *http.Request, id identity) {
	if id.sessionID != "" && s.auth.sessions != nil {
		if err := s.auth.sessions.RevokeSession(context.WithoutCancel(r.Context()), id.sessionID); err != nil {
			s.fail(w, r, id, false, err)
			return
		}
	}
	s.auth.setSession(w, "", -1)
	http.Redirect(w, r, s.cfg.BasePath+"/login", http.StatusSeeOther)
}
