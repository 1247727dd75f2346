package console

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/mask"
	"github.com/idemhq/idem/internal/promreg"
	"github.com/idemhq/idem/internal/seal"
)

// maxBody bounds a request body: an edited payload of up to 1 MiB, escaped.
const maxBody = 8 << 20

// server is the console's handler.
type server struct {
	cfg   Config
	store *failidx.Store   // reads the index
	acts  *failidx.Actions // changes it and publishes; every action is audited
	auth  *auth
	mask  *mask.Masker
	pages map[string]*template.Template
	mux   *http.ServeMux
	log   *slog.Logger
}

// route is one registered endpoint. Every route the console serves is in
// routes(); the OpenAPI test compares the api ones with openapi.yaml.
type route struct {
	method, path string // path in net/http pattern syntax, without BasePath
	role         Role   // least role that may call it
	api          bool   // JSON API (bearer token) rather than UI (session)
	public       bool   // served without credentials (login page, assets)
	h            func(w http.ResponseWriter, r *http.Request, id identity)
}

// New returns the console's handler: the JSON API under /api/ (described by
// /api/openapi.yaml) and the web UI everywhere else, both relative to
// cfg.BasePath, on the failure index in cfg.Pool, publishing through
// cfg.Client. Mount it on a service's own mux, e.g.
//
//	client, err := sarama.NewClient(brokers, index.ProducerConfig(nil))
//	…
//	h, err := console.New(console.Config{Pool: pool, Client: client, Tokens: toks, BasePath: "/console"})
//	mux.Handle("/console/", http.StripPrefix("/console", h))
//
// New returns an error when cfg does not validate (see Config.Validate).
// It creates no table: run idem.Migrate (or an index.Indexer) first.
func New(cfg Config) (http.Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	store := failidx.NewStore(cfg.Pool)
	sl, err := openSealer(cfg.Pool, cfg.EncryptionKeyFile, cfg.EncryptionKey)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	store = store.Sealed(sl)
	s, err := newServer(cfg, store, failidx.NewActions(store, cfg.Client))
	if err != nil {
		return nil, err // not a nil *server in a non-nil http.Handler
	}
	return s, nil
}

// openSealer returns the failure index's sealer for the key-encryption
// key of file or text (nil when both are empty), checked against the
// index's data keys (a wrong key is refused, seal.ErrWrongKEK).
func openSealer(pool *pgxpool.Pool, file, text string) (*seal.Sealer, error) {
	keks, err := seal.LoadKEKs(file, text)
	if err != nil || keks == nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return seal.New(ctx, seal.Config{DB: pool, KEKs: keks, Purpose: failidx.Purpose})
}

// newServer is New on the index store and actions given: the tests give
// ones without a database or a Kafka client. cfg.Pool and cfg.Client are
// not used; every other field must validate.
func newServer(cfg Config, store *failidx.Store, acts *failidx.Actions) (*server, error) {
	if err := cfg.validateOptions(); err != nil {
		return nil, err
	}
	cfg = cfg.defaults()
	key := cfg.SessionKey
	if key == nil {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("console: session key: %w", err)
		}
	}
	m, err := mask.New(cfg.Mask)
	if err != nil {
		return nil, err
	}
	path := cfg.BasePath
	if path == "" {
		path = "/"
	}
	s := &server{
		cfg:   cfg,
		store: store,
		acts:  acts,
		mask:  m,
		auth: &auth{tokens: cfg.Tokens, insecure: cfg.InsecureNoAuth, key: key, ttl: cfg.SessionTTL,
			secure: cfg.SecureCookies, path: path, now: cfg.now},
		mux: http.NewServeMux(),
		log: cfg.Logger,
	}
	if s.pages, err = parsePages(cfg.BasePath); err != nil {
		return nil, err
	}
	for _, rt := range s.routes() {
		s.mux.Handle(rt.method+" "+rt.path, s.wrap(rt))
	}
	if cfg.Registerer != nil {
		if promreg.Register(cfg.Registerer, failidx.NewCollector(store), &err); err != nil {
			return nil, fmt.Errorf("console: register collectors: %w", err)
		}
	}
	return s, nil
}

// ServeHTTP sets the security headers every response carries and routes.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if s.cfg.InsecureNoAuth && !loopbackHost(r.Host) {
		// Without authentication, only a page of the loopback origin may talk
		// to the console: a site whose name resolves to 127.0.0.1 (DNS
		// rebinding) is not that origin.
		http.Error(w, "console without authentication: use http://127.0.0.1:PORT/ or http://localhost:PORT/", http.StatusMisdirectedRequest)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// wrap authenticates, authorizes and CSRF-checks a request for rt.
func (s *server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt.public {
			rt.h(w, r, identity{})
			return
		}
		id, err := s.identify(w, r, rt.api)
		if err != nil {
			if rt.api {
				w.Header().Set("WWW-Authenticate", `Bearer realm="idem console"`)
				s.apiError(w, http.StatusUnauthorized, "unauthorized: "+err.Error()+"; send Authorization: Bearer <token>", "")
			} else if r.Method == http.MethodGet {
				http.Redirect(w, r, s.cfg.BasePath+"/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			} else {
				s.uiError(w, r, id, http.StatusUnauthorized, "Your session has ended: log in again.")
			}
			return
		}
		if id.Role < rt.role {
			msg := fmt.Sprintf("forbidden: %s needs the %s role; %s is %s", rt.method+" "+rt.path, rt.role, id.Name, id.Role)
			if rt.api {
				s.apiError(w, http.StatusForbidden, msg, "")
			} else {
				s.uiError(w, r, id, http.StatusForbidden, msg)
			}
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if rt.api {
				if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
					s.apiError(w, http.StatusUnsupportedMediaType, "send the request body as Content-Type: application/json", "")
					return
				}
			}
			if !s.auth.checkCSRF(r, id, rt.api) {
				msg := "forbidden: missing or invalid CSRF token; reload the page and try again"
				if rt.api {
					s.apiError(w, http.StatusForbidden, msg, "")
				} else {
					s.uiError(w, r, id, http.StatusForbidden, msg)
				}
				return
			}
		}
		rt.h(w, r, id)
	})
}

// identify returns who r acts as. API requests use a bearer token (or, from
// the UI's own pages, the session cookie); UI requests use the session
// cookie. With InsecureNoAuth, everyone is the admin "anonymous", and a UI
// request gets a session cookie so that its forms carry CSRF tokens.
func (s *server) identify(w http.ResponseWriter, r *http.Request, api bool) (identity, error) {
	if api {
		id, err := s.auth.bearer(r)
		if err == nil || !errors.Is(err, errNoCredentials) {
			return id, err
		}
	}
	id, err := s.auth.session(r)
	if err == nil {
		return id, nil
	}
	if s.cfg.InsecureNoAuth {
		anon := identity{Name: "anonymous", Role: Admin}
		if !api && r.Method == http.MethodGet {
			anon.session = s.auth.newSession(anon)
			s.auth.setSession(w, anon.session, int(s.cfg.SessionTTL.Seconds()))
		}
		return anon, nil
	}
	return identity{}, err
}

// apiError writes {"error": msg, "field": field}.
func (s *server) apiError(w http.ResponseWriter, code int, msg, field string) {
	writeJSON200(w, code, map[string]string{"error": msg, "field": field})
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
func errorStatus(err error) (code int, msg, field string) {
	var ve *failidx.ValidationError
	switch {
	case errors.As(err, &ve):
		return http.StatusBadRequest, ve.Error(), ve.Field
	case errors.Is(err, dlq.ErrUnknownTopic):
		return http.StatusBadRequest, err.Error(), "to"
	case errors.Is(err, failidx.ErrNotFound):
		return http.StatusNotFound, err.Error(), ""
	}
	var ie *inputError
	if errors.As(err, &ie) {
		return ie.code, ie.msg, ie.field
	}
	return http.StatusInternalServerError, "internal error: " + err.Error(), ""
}

// inputError is bad input the console itself found.
type inputError struct {
	code       int
	field, msg string
}

func (e *inputError) Error() string { return e.msg }

func badInput(field, format string, args ...any) error {
	return &inputError{code: http.StatusBadRequest, field: field, msg: fmt.Sprintf(format, args...)}
}

// fail writes err as the API's or the UI's error response.
func (s *server) fail(w http.ResponseWriter, r *http.Request, id identity, api bool, err error) {
	code, msg, field := errorStatus(err)
	if code >= 500 {
		s.log.ErrorContext(r.Context(), "console: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if api {
		s.apiError(w, code, msg, field)
		return
	}
	s.uiError(w, r, id, code, msg)
}

// loopbackHost reports whether a Host header names the loopback interface.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
