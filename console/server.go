package console

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/control"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/mask"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/seal"
)

// maxBody bounds a request body: an edited payload of up to 1 MiB, escaped.
const maxBody = 8 << 20

// server is the console's handler.
type server struct {
	cfg   Config
	store *failidx.Store   // reads the index
	acts  *failidx.Actions // changes it and publishes; every action is audited
	ctl   control.Admin    // the live controls (controls.go)
	auth  *auth
	mask  *mask.Masker
	pages map[string]*template.Template
	mux   *http.ServeMux
	log   *slog.Logger

	// The jobs the console runs (replays, edits), on ctx, which Close
	// ends; running maps a job to a channel closed when its run ends.
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	running map[int64]chan struct{}
	closed  sync.Once
}

// route is one registered endpoint. Every route the console serves is in
// routes(); the OpenAPI test compares the api ones with openapi.yaml.
type route struct {
	method, path string // path in net/http pattern syntax, without BasePath
	role         Role   // least role that may call it
	api          bool   // JSON API (bearer token) rather than UI (session)
	public       bool   // served without credentials (login page, assets)
	// action names the audited action the route makes ("" for reads): a
	// request the console refuses (403, 400) is audited under it. "*"
	// takes it from the path's {action} or the form's action field.
	action string
	h      func(w http.ResponseWriter, r *http.Request, id identity)
}

// Console is the failure console: the JSON API under /api/ (described by
// /api/openapi.yaml) and the web UI everywhere else, an http.Handler. It
// runs the replay and edit-and-retry jobs its users start (a job outlives
// the request that started it, and takes over the jobs that another
// console stopped or lost), until Close.
type Console struct {
	s *server
}

// ServeHTTP serves the API and the UI.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.s.ServeHTTP(w, r) }

// Close stops the console's jobs and waits for them: a job not finished is
// handed back unfinished, and the next console on the same database (this
// process restarted, or another replica) resumes it at once. Requests
// served after Close start no job. It is safe to call more than once.
func (c *Console) Close() error {
	c.s.close()
	return nil
}

// New returns the console on the failure index in cfg.Pool, publishing
// through cfg.Client, relative to cfg.BasePath. Mount it on a service's own
// mux, e.g.
//
//	pcfg := sarama.NewConfig()
//	retrytopic.ConfigureProducer(pcfg)
//	client, err := sarama.NewClient(brokers, pcfg)
//	…
//	c, err := console.New(console.Config{Pool: pool, Client: client, Tokens: toks, BasePath: "/console"})
//	defer c.Close()
//	mux.Handle("/console/", http.StripPrefix("/console", c))
//
// New returns an error when cfg does not validate (see Config.Validate).
// It creates no table: run idem.Migrate (or an index.Indexer) first. It
// starts a goroutine that resumes the jobs no console runs (a console that
// stopped hands its jobs back; one that died leaves them for 30 s) and
// sweeps expired sessions; Close stops it.
func New(cfg Config) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	store := failidx.NewStore(cfg.Pool)
	sl, err := openSealer(cfg.Pool, cfg.EncryptionKeyFile, cfg.EncryptionKey)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	store = store.Sealed(sl)
	acts := failidx.NewActions(store, cfg.Client)
	acts.ReplayTopics = cfg.ReplayTopics
	s, err := newServer(cfg, store, acts)
	if err != nil {
		return nil, err
	}
	s.auth.sessions = store
	s.wg.Go(s.background)
	return &Console{s: s}, nil
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

// newServer is New on the index store and actions given, without the
// background goroutine or a session store: the tests give ones without a
// database or a Kafka client. cfg.Pool and cfg.Client are not used; every
// other field must validate.
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
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{
		cfg:   cfg,
		store: store,
		acts:  acts,
		mask:  m,
		auth: &auth{tokens: cfg.Tokens, insecure: cfg.InsecureNoAuth, key: key, ttl: cfg.SessionTTL,
			secure: cfg.SecureCookies, path: path, now: cfg.now, limits: newLimiter(cfg.now, cfg.loginBurst)},
		mux:     http.NewServeMux(),
		log:     cfg.Logger,
		ctx:     ctx,
		cancel:  cancel,
		running: map[int64]chan struct{}{},
	}
	if cfg.Pool != nil {
		s.ctl = control.Admin{DB: cfg.Pool, MaxRedrivesPerHour: cfg.MaxRedrivesPerHour}
	}
	if s.pages, err = parsePages(cfg.BasePath); err != nil {
		cancel()
		return nil, err
	}
	for _, rt := range s.routes() {
		s.mux.Handle(rt.method+" "+rt.path, s.wrap(rt))
	}
	if cfg.Registerer != nil {
		if coremetrics.Register(cfg.Registerer, failidx.NewCollector(store), &err); err != nil {
			cancel()
			return nil, fmt.Errorf("console: register collectors: %w", err)
		}
	}
	return s, nil
}

// close ends the jobs' context and waits for the jobs and the background
// goroutine.
func (s *server) close() {
	s.closed.Do(func() {
		s.cancel()
		s.wg.Wait()
	})
}

// resumeEvery is how often the console looks for jobs no console runs.
const resumeEvery = 5 * time.Second

// background resumes the jobs no console runs, every resumeEvery, and
// sweeps expired sessions every hour, until Close.
func (s *server) background() {
	var swept time.Time
	for {
		ids, err := s.acts.ResumeJobs(s.ctx)
		if err != nil && s.ctx.Err() == nil {
			s.log.Warn("console: resume jobs", "err", err)
		}
		for _, id := range ids {
			s.log.Info("console: resuming a job no console runs", "job", id)
			s.runJob(id)
		}
		if time.Since(swept) > time.Hour {
			if err := s.store.SweepSessions(s.ctx); err != nil && s.ctx.Err() == nil {
				s.log.Warn("console: sweep sessions", "err", err)
			}
			swept = time.Now()
		}
		if !pglead.Sleep(s.ctx, resumeEvery) {
			return
		}
	}
}

// runJob runs job id in a goroutine of the console's (not of a request)
// and returns a channel closed when that run ends.
func (s *server) runJob(id int64) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.running[id]; ok {
		return ch
	}
	ch := make(chan struct{})
	if s.ctx.Err() != nil {
		close(ch)
		return ch
	}
	s.running[id] = ch
	s.wg.Go(func() {
		defer func() {
			s.mu.Lock()
			delete(s.running, id)
			s.mu.Unlock()
			close(ch)
		}()
		if _, err := s.acts.RunJob(s.ctx, id); err != nil && s.ctx.Err() == nil {
			s.log.Warn("console: job", "job", id, "err", err)
		}
	})
	return ch
}

// ServeHTTP sets the security headers every response carries, bounds the
// request (its body's size and read time, its database work) and routes.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if s.cfg.SecureCookies {
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	// A body that trickles in is cut off (the server's own ReadTimeout, if
	// any, still applies; this one holds for a console mounted anywhere).
	_ = http.NewResponseController(w).SetReadDeadline(s.cfg.now().Add(s.cfg.ReadTimeout))
	if s.cfg.InsecureNoAuth {
		// Without authentication, only the loopback interface may talk to
		// the console: the connection's peer must be loopback (the Host
		// header is the client's to choose), and so must the Host, so that
		// a site whose name resolves to 127.0.0.1 (DNS rebinding) is not
		// served either.
		if !loopbackHost(r.RemoteAddr) {
			http.Error(w, "console without authentication: only clients on this machine (a loopback address) are served", http.StatusForbidden)
			return
		}
		if !loopbackHost(r.Host) {
			http.Error(w, "console without authentication: use http://127.0.0.1:PORT/ or http://localhost:PORT/", http.StatusMisdirectedRequest)
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
	defer cancel()
	s.mux.ServeHTTP(w, r.WithContext(ctx))
}

// wrap authenticates, authorizes and CSRF-checks a request for rt. A
// request for an action refused here (the role, the CSRF token) is audited.
func (s *server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt.public {
			rt.h(w, r, identity{})
			return
		}
		id, err := s.identify(w, r, rt.api)
		if err != nil {
			switch {
			case errors.Is(err, errTooMany):
				w.Header().Set("Retry-After", strconv.Itoa(int(loginRefill.Seconds())))
				if rt.api {
					s.apiError(w, http.StatusTooManyRequests, err.Error(), "", "")
				} else {
					s.uiError(w, r, id, http.StatusTooManyRequests, err.Error())
				}
			case rt.api:
				w.Header().Set("WWW-Authenticate", `Bearer realm="idem console"`)
				s.apiError(w, http.StatusUnauthorized, "unauthorized: "+err.Error()+"; send Authorization: Bearer <token>", "", "")
			case r.Method == http.MethodGet:
				http.Redirect(w, r, s.cfg.BasePath+"/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			default:
				s.uiError(w, r, id, http.StatusUnauthorized, "Your session has ended: log in again.")
			}
			return
		}
		if id.Role < rt.role {
			msg := fmt.Sprintf("forbidden: %s needs the %s role; %s is %s", rt.method+" "+rt.path, rt.role, id.Name, id.Role)
			s.refuse(w, r, id, rt, &inputError{code: http.StatusForbidden, msg: msg})
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if rt.api {
				if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
					s.refuse(w, r, id, rt, &inputError{code: http.StatusUnsupportedMediaType, msg: "send the request body as Content-Type: application/json"})
					return
				}
			}
			if !s.auth.checkCSRF(r, id, rt.api) {
				s.refuse(w, r, id, rt, &inputError{code: http.StatusForbidden, msg: "forbidden: missing or invalid CSRF token; reload the page and try again"})
				return
			}
		}
		rt.h(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, rt)), id)
	})
}

// routeKey is the context key of the route a request was routed to (fail
// audits the refusals of action routes).
type routeKey struct{}

// identify returns who r acts as. API requests use a bearer token (or, from
// the UI's own pages, the session cookie); UI requests use the session
// cookie. With InsecureNoAuth, everyone is the admin "anonymous", and a UI
// request gets a session cookie so that its forms carry CSRF tokens.
func (s *server) identify(w http.ResponseWriter, r *http.Request, api bool) (identity, error) {
	if api {
		id, err := s.auth.bearer(r, clientAddr(r, s.cfg.BehindProxy))
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
			if anon.session, err = s.auth.newSession(r.Context(), anon); err != nil {
				return identity{}, err
			}
			s.auth.setSession(w, anon.session, int(s.cfg.SessionTTL.Seconds()))
		}
		return anon, nil
	}
	if !errors.Is(err, errNoCredentials) {
		s.log.InfoContext(r.Context(), "console: session refused", "err", err)
	}
	return identity{}, err
}

// loopbackHost reports whether a host or host:port (a Host header, a
// connection's address) names the loopback interface.
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
