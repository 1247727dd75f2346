package console

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idemhq/idem/internal/failidx"
)

// offlineServer is a server whose store is never reached: every request in
// the tests that use it stops at routing or authentication.
func offlineServer(t *testing.T) *server {
	t.Helper()
	st := failidx.NewStore(nil)
	s, err := newServer(Config{Tokens: []Token{{Name: "v", Role: Viewer, Secret: "viewer-secret-0123456789"}}}, st, failidx.NewActions(st, nil))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// documented returns "METHOD /path" for every operation of openapi.yaml.
func documented(t *testing.T) []string {
	t.Helper()
	var doc struct {
		OpenAPI string                               `yaml:"openapi"`
		Paths   map[string]map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(openapiYAML, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi.yaml: version %q, want 3.x", doc.OpenAPI)
	}
	var ops []string
	for p, methods := range doc.Paths {
		for m := range methods {
			if m == "parameters" {
				continue
			}
			ops = append(ops, strings.ToUpper(m)+" "+p)
		}
	}
	slices.Sort(ops)
	return ops
}

// TestOpenAPIMatchesRoutes checks openapi.yaml against the routes the
// handler registers, both ways: every API route is documented, every
// documented operation is served (not 404 or 405), and a path under /api/
// that is not documented is not served.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	s := offlineServer(t)
	var registered []string
	for _, rt := range s.routes() {
		if rt.api {
			registered = append(registered, rt.method+" "+rt.path)
		}
	}
	slices.Sort(registered)
	doc := documented(t)
	for _, r := range registered {
		if !slices.Contains(doc, r) {
			t.Errorf("route %s is registered but not in openapi.yaml", r)
		}
	}
	for _, d := range doc {
		if !slices.Contains(registered, d) {
			t.Errorf("openapi.yaml documents %s, which is not registered", d)
		}
	}
	// Through the real handler: each documented operation reaches a route.
	for _, d := range doc {
		method, path, _ := strings.Cut(d, " ")
		path = strings.NewReplacer("{id}", "1", "{action}", "replay").Replace(path)
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(method, path, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		s.ServeHTTP(rec, req)
		if rec.Code == http.StatusNotFound || rec.Code == http.StatusMethodNotAllowed {
			t.Errorf("%s %s: %d, want a served route", method, path, rec.Code)
		}
		want := http.StatusUnauthorized
		if path == "/api/openapi.yaml" {
			want = http.StatusOK
		}
		if rec.Code != want {
			t.Errorf("%s %s without a token: %d, want %d", method, path, rec.Code, want)
		}
	}
	for _, d := range []string{"GET /api/nope", "DELETE /api/records/1", "PUT /api/actions/replay", "GET /api/records/1/edit-retry"} {
		method, path, _ := strings.Cut(d, " ")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		if rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("undocumented %s: %d, want 404 or 405", d, rec.Code)
		}
	}
}

// TestOpenAPIRefsResolve: every $ref of openapi.yaml names a component that
// exists, and every path parameter is declared.
func TestOpenAPIRefsResolve(t *testing.T) {
	var doc map[string]any
	if err := yaml.Unmarshal(openapiYAML, &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, sub := range x {
				if k == "$ref" {
					ref, _ := sub.(string)
					var node any = doc
					for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
						m, ok := node.(map[string]any)
						if !ok {
							node = nil
							break
						}
						node = m[part]
					}
					if !strings.HasPrefix(ref, "#/") || node == nil {
						t.Errorf("$ref %q does not resolve", ref)
					}
				}
				walk(sub)
			}
		case []any:
			for _, sub := range x {
				walk(sub)
			}
		}
	}
	walk(doc)
	for p, ops := range doc["paths"].(map[string]any) {
		for m, op := range ops.(map[string]any) {
			text, _ := yaml.Marshal(op)
			for _, name := range []string{"id", "action"} {
				if strings.Contains(p, "{"+name+"}") && !strings.Contains(string(text), "parameters/"+name) && !strings.Contains(string(text), "name: "+name) {
					t.Errorf("%s %s does not declare its path parameter %s", m, p, name)
				}
			}
		}
	}
}
