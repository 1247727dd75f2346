package console

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestCSRFOnEveryForm walks every state-changing route the console
// registers (routes(), so a route added later is covered): as the admin, a
// UI form without the CSRF token, or with a forged one, is refused with 403
// naming CSRF, and so is an API call made with the session cookie but no
// X-CSRF-Token header. The login form needs its own token too. Nothing of
// it changes the index; each refused action writes an audit row saying so.
func TestCSRFOnEveryForm(t *testing.T) {
	e := newEnv(t, nil)
	ids, _, _ := seedTwo(t, e)
	id := fmt.Sprint(ids[0])
	admin := e.login(t, adminSecret)
	path := func(p string) string {
		return strings.NewReplacer("{id}", id, "{action}", "archive").Replace(p)
	}
	var forms, apis, audited int
	for _, rt := range (&server{}).routes() {
		if rt.method == http.MethodGet || rt.method == http.MethodHead || rt.public {
			continue
		}
		form := url.Values{"action": {"archive"}, "ids": {id}, "reason": {"csrf test"}, "value": {`{}`},
			"group": {"billing"}, "topic": {"t"}, "key": {"k"}}
		if rt.action != "" {
			audited++
			if !rt.api {
				audited++ // two tries below
			}
		}
		if rt.api {
			apis++
			req, _ := http.NewRequest(rt.method, e.srv.URL+path(rt.path), strings.NewReader(`{"ids":[`+id+`],"reason":"csrf test","value":"{}"}`))
			req.Header.Set("Content-Type", "application/json")
			resp, err := admin.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("API %s %s from the session without X-CSRF-Token: %d, want 403", rt.method, rt.path, resp.StatusCode)
			}
			continue
		}
		forms++
		for name, tok := range map[string]string{"no": "", "a forged": "AAAAAAAAAAAAAAAAAAAAAAAA"} {
			f := url.Values{}
			for k, v := range form {
				f[k] = v
			}
			if tok != "" {
				f.Set("csrf", tok)
			}
			if code, b := e.post(t, admin, path(rt.path), f); code != http.StatusForbidden || !bytes.Contains(b, []byte("CSRF")) {
				t.Errorf("UI %s %s with %s CSRF token: %d, want 403 naming CSRF", rt.method, rt.path, name, code)
			}
		}
	}
	if forms < 8 || apis < 4 {
		t.Fatalf("walked %d forms and %d API calls: routes() lost its state-changing routes", forms, apis)
	}
	// The login form: a token but not the form's CSRF token.
	if code, _ := e.post(t, &http.Client{}, "/login", url.Values{"token": {adminSecret}}); code != http.StatusForbidden {
		t.Errorf("POST /login without the form's token: %d, want 403", code)
	}
	if got := statuses(t, e, ids...); got != "unresolved,unresolved" {
		t.Errorf("statuses after refused requests: %s", got)
	}
	// Each refused action is audited as a refusal (the login is no action).
	es := e.audit(t)
	if len(es) != audited {
		t.Errorf("%d audit rows after %d refused requests for actions", len(es), audited)
	}
	for _, a := range es {
		if a.Actor != "alice" || !strings.HasPrefix(a.Result, "rejected 403") || !strings.Contains(a.Result, "CSRF") {
			t.Errorf("audit row of a refused request: %+v", a)
		}
	}
}
