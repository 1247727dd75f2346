package console

import (
	"embed"
	"net/http"
)

// openapiYAML describes the JSON API; TestOpenAPIMatchesRoutes checks it
// against routes() both ways.
//
//go:embed openapi.yaml
var openapiYAML []byte

//go:embed static
var staticFS embed.FS

// routes lists every endpoint the console serves.
func (s *server) routes() []route {
	return []route{
		// JSON API.
		{method: "GET", path: "/api/openapi.yaml", api: true, public: true, h: s.apiOpenAPI},
		{method: "GET", path: "/api/whoami", api: true, role: Viewer, h: s.apiWhoami},
		{method: "GET", path: "/api/overview", api: true, role: Viewer, h: s.apiOverview},
		{method: "GET", path: "/api/groups", api: true, role: Viewer, h: s.apiGroups},
		{method: "GET", path: "/api/records", api: true, role: Viewer, h: s.apiRecords},
		{method: "GET", path: "/api/records/{id}", api: true, role: Viewer, h: s.apiRecord},
		{method: "POST", path: "/api/records/{id}/reveal", api: true, role: Operator, action: "reveal", h: s.apiRevealRecord},
		{method: "GET", path: "/api/records/{id}/value", api: true, role: Viewer, h: s.apiValue},
		{method: "POST", path: "/api/records/{id}/value", api: true, role: Operator, action: "reveal", h: s.apiRevealValue},
		{method: "POST", path: "/api/records/{id}/edit-retry", api: true, role: Operator, action: "edit-retry", h: s.apiEditRetry},
		{method: "POST", path: "/api/actions/{action}", api: true, role: Operator, action: "*", h: s.apiAction},
		{method: "GET", path: "/api/jobs", api: true, role: Viewer, h: s.apiJobs},
		{method: "GET", path: "/api/jobs/{id}", api: true, role: Viewer, h: s.apiJob},
		{method: "POST", path: "/api/jobs/{id}/cancel", api: true, role: Operator, action: "cancel-job", h: s.apiCancelJob},
		{method: "GET", path: "/api/parked-keys", api: true, role: Viewer, h: s.apiParked},
		{method: "POST", path: "/api/parked-keys/release", api: true, role: Operator, action: "release-key", h: s.apiRelease},
		{method: "GET", path: "/api/outbox/failed", api: true, role: Viewer, h: s.apiOutbox},
		{method: "POST", path: "/api/outbox/retry", api: true, role: Operator, action: "retry-outbox", h: s.apiOutboxRetry},
		{method: "GET", path: "/api/audit", api: true, role: Viewer, h: s.apiAudit},
		{method: "GET", path: "/api/fleet", api: true, role: Viewer, h: s.apiFleet},
		{method: "GET", path: "/api/pauses", api: true, role: Viewer, h: s.apiPauses},
		{method: "POST", path: "/api/pauses", api: true, role: Admin, action: "pause", h: s.apiSetPause(true)},
		{method: "POST", path: "/api/pauses/resume", api: true, role: Admin, action: "resume", h: s.apiSetPause(false)},
		{method: "GET", path: "/api/redrives", api: true, role: Viewer, h: s.apiRedrives},
		{method: "POST", path: "/api/redrives", api: true, role: Admin, action: "redrive", h: s.apiRedrive},
		{method: "GET", path: "/api/redrives/{id}", api: true, role: Viewer, h: s.apiRedriveOne},
		{method: "POST", path: "/api/redrives/{id}/cancel", api: true, role: Admin, action: "redrive-cancel", h: s.apiCancelRedrive},

		// Web UI.
		{method: "GET", path: "/static/", public: true, h: s.static},
		{method: "GET", path: "/login", public: true, h: s.loginPage},
		{method: "POST", path: "/login", public: true, h: s.login},
		{method: "POST", path: "/logout", role: Viewer, h: s.logout},
		{method: "GET", path: "/{$}", role: Viewer, h: s.uiOverview},
		{method: "GET", path: "/groups", role: Viewer, h: s.uiGroups},
		{method: "GET", path: "/records", role: Viewer, h: s.uiRecords},
		{method: "GET", path: "/records/{id}", role: Viewer, h: s.uiRecord},
		{method: "POST", path: "/records/{id}/reveal", role: Operator, action: "reveal", h: s.uiReveal},
		{method: "GET", path: "/records/{id}/value", role: Viewer, h: s.uiValue},
		{method: "POST", path: "/records/{id}/value", role: Operator, action: "reveal", h: s.uiRevealValue},
		{method: "POST", path: "/records/{id}/edit", role: Operator, action: "reveal", h: s.uiEdit},
		{method: "POST", path: "/records/{id}/edit-retry", role: Operator, action: "edit-retry", h: s.uiEditRetry},
		{method: "POST", path: "/actions", role: Operator, action: "*", h: s.uiAction},
		{method: "GET", path: "/jobs", role: Viewer, h: s.uiJobs},
		{method: "GET", path: "/jobs/{id}", role: Viewer, h: s.uiJob},
		{method: "POST", path: "/jobs/{id}/cancel", role: Operator, action: "cancel-job", h: s.uiCancelJob},
		{method: "GET", path: "/parked-keys", role: Viewer, h: s.uiParked},
		{method: "POST", path: "/parked-keys/release", role: Operator, action: "release-key", h: s.uiRelease},
		{method: "GET", path: "/outbox", role: Viewer, h: s.uiOutbox},
		{method: "POST", path: "/outbox/retry", role: Operator, action: "retry-outbox", h: s.uiOutboxRetry},
		{method: "GET", path: "/audit", role: Viewer, h: s.uiAudit},
		{method: "GET", path: "/fleet", role: Viewer, h: s.uiFleet},
		{method: "POST", path: "/pauses", role: Admin, action: "pause", h: s.uiSetPause(true)},
		{method: "POST", path: "/pauses/resume", role: Admin, action: "resume", h: s.uiSetPause(false)},
		{method: "GET", path: "/redrives", role: Viewer, h: s.uiRedrives},
		{method: "POST", path: "/redrives", role: Admin, action: "redrive", h: s.uiRedrive},
		{method: "GET", path: "/redrives/{id}", role: Viewer, h: s.uiRedriveOne},
		{method: "POST", path: "/redrives/{id}/cancel", role: Admin, action: "redrive-cancel", h: s.uiCancelRedrive},
	}
}

// static serves the embedded CSS and the vendored htmx.
func (s *server) static(w http.ResponseWriter, r *http.Request, _ identity) {
	w.Header().Set("Cache-Control", "public, max-age=3600")
	http.FileServerFS(staticFS).ServeHTTP(w, r)
}
