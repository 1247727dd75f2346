package serde

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
)

// The schema types of Schema.Type: the registry's schemaType values.
const (
	typeAvro     = "AVRO"
	typeProtobuf = "PROTOBUF"
	typeJSON     = "JSON"
)

// Schema is a schema the registry holds, as a Registry returns it. It is
// shared by every caller that asks for the same id: do not modify it.
type Schema struct {
	// ID is the registry's id of the schema: the one written after the
	// magic byte of every record encoded with it.
	ID int
	// Type is "AVRO", "PROTOBUF" or "JSON" (JSON Schema), as the registry
	// says (it leaves out AVRO, which Schema fills in).
	Type string
	// Text is the schema itself: Avro's JSON, a .proto file, a JSON Schema.
	Text string

	refs []ref // the schemas it references, resolved (their own first)

	once   sync.Once
	parsed any // *avroParsed, *protoParsed or *jsonParsed
	err    error

	nameOnce sync.Once // recordName
	name     string
	nameErr  error
}

// ref is one schema a schema references, with the name the referencing
// schema uses for it (a .proto import path, an Avro full name, a JSON
// Schema $ref URL).
type ref struct {
	name string
	text string
	typ  string
}

// Registry is a client of a schema registry that speaks Confluent's REST
// API, with caches: a schema by id is fetched once for the Registry's
// lifetime (concurrent misses share one request), a subject's latest version
// is kept for SubjectTTL. It is safe for concurrent use; make one per
// process and share it between codecs.
//
// Errors: an id or subject the registry does not know is a handler.Decode
// error wrapping a *DecodeError (the record names a schema nobody can read:
// poison); a registry that cannot be reached, times out, answers 5xx, 401,
// 403 or 429 is an *UnavailableError (wait: no record is to blame);
// anything else is returned as it is.
type Registry struct {
	cl     *sr.Client
	cfg    RegistryConfig
	breaks *breaker.Set

	mu       sync.Mutex
	byID     map[int]*Schema
	inflight map[int]*fetch
	latest   map[string]latestEntry
	byRef    map[sr.SchemaReference]sr.SubjectSchema
	subjects map[int]string // id → a subject it is registered under ("": none known)
}

// fetch is a request for one id several callers wait for.
type fetch struct {
	done chan struct{}
	s    *Schema
	err  error
}

type latestEntry struct {
	s  *Schema
	at time.Time
}

// breakerName names the registry in the *breaker.OpenError of an
// *UnavailableError, and so in the consumer's "breaker open" logs.
const breakerName = "schema-registry"

// NewRegistry returns a Registry for cfg, or an error that names every bad
// field ("serde: invalid config: RegistryConfig.URL = …"). It makes no
// request.
//
// The HTTP layer is franz-go's pkg/sr (a module of its own, independent of
// the franz-go Kafka client): see the package doc for why.
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	cfg = cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg.TLS
	opts := []sr.ClientOpt{
		sr.URLs(cfg.urls()...),
		sr.HTTPClient(&http.Client{Timeout: cfg.Timeout, Transport: tr}),
		sr.UserAgent("idem-serde"),
	}
	if cfg.Username != "" {
		opts = append(opts, sr.BasicAuth(cfg.Username, cfg.Password))
	}
	if cfg.BearerToken != "" {
		opts = append(opts, sr.BearerToken(cfg.BearerToken))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("serde: registry client: %w", err)
	}
	// One failure opens the breaker: a registry that refused one request is
	// not asked again for OutagePause, and the consumer pauses that long.
	set, err := breaker.NewSet(breaker.Settings{
		ConsecutiveFailures: 1,
		OpenTimeout:         cfg.OutagePause,
		HalfOpenProbes:      1,
		IsFailure:           isOutage,
	})
	if err != nil {
		return nil, fmt.Errorf("serde: registry breaker: %w", err)
	}
	return &Registry{
		cl: cl, cfg: cfg, breaks: set,
		byID:     map[int]*Schema{},
		inflight: map[int]*fetch{},
		latest:   map[string]latestEntry{},
		byRef:    map[sr.SchemaReference]sr.SubjectSchema{},
		subjects: map[int]string{},
	}, nil
}

// call runs one request through the registry's breaker and sorts its
// failure: ctx's own end as it is, an outage as an *UnavailableError, a 404
// as errNotFound, anything else wrapped with op.
func (r *Registry) call(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	err := r.breaks.Do(ctx, breakerName, fn)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return err
	case breaker.IsOpen(err):
		return &UnavailableError{URL: r.cfg.URL, Op: op, Err: err}
	case isOutage(err):
		// Failed while another call had just opened the breaker: the same
		// outage, reported the same way.
		return &UnavailableError{URL: r.cfg.URL, Op: op, Err: &breaker.OpenError{
			Name: breakerName, State: breaker.Open, RetryAfter: r.cfg.OutagePause, Cause: err}}
	}
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%w: %w", errNotFound, err)
	}
	return fmt.Errorf("serde: %s: %w", op, err)
}

// errNotFound marks a 404 of the registry: no such id, subject or version.
var errNotFound = errors.New("not found in the registry")

// isOutage reports whether a request's error means the registry cannot
// serve anyone now: no answer (refused, reset, timed out), a 5xx, or an
// answer that is about us rather than the request (401, 403, 408, 429).
func isOutage(err error) bool {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch c := re.StatusCode; {
		case c >= 500, c == http.StatusUnauthorized, c == http.StatusForbidden,
			c == http.StatusRequestTimeout, c == http.StatusTooManyRequests:
			return true
		}
		return false
	}
	// No HTTP answer at all: the transport failed (pkg/sr wraps the
	// *url.Error of net/http).
	var ue *url.Error
	return errors.As(err, &ue)
}

// SchemaByID returns the schema with registry id id, with the schemas it
// references. It asks the registry once per id for the Registry's lifetime;
// callers that miss at once share one request. An id the registry does not
// know is a handler.Decode error wrapping a *DecodeError.
func (r *Registry) SchemaByID(ctx context.Context, id int) (*Schema, error) {
	r.mu.Lock()
	if s, ok := r.byID[id]; ok {
		r.mu.Unlock()
		return s, nil
	}
	f, waiting := r.inflight[id]
	if !waiting {
		f = &fetch{done: make(chan struct{})}
		r.inflight[id] = f
	}
	r.mu.Unlock()
	if waiting {
		select {
		case <-f.done:
			return f.s, f.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.s, f.err = r.fetchID(ctx, id)
	r.mu.Lock()
	delete(r.inflight, id)
	if f.err == nil {
		r.byID[id] = f.s
	}
	r.mu.Unlock()
	close(f.done)
	return f.s, f.err
}

func (r *Registry) fetchID(ctx context.Context, id int) (*Schema, error) {
	var got sr.Schema
	err := r.call(ctx, fmt.Sprintf("schema id %d", id), func(ctx context.Context) error {
		var err error
		got, err = r.cl.SchemaByID(ctx, id)
		return err
	})
	if errors.Is(err, errNotFound) {
		return nil, handler.Decode(&DecodeError{SchemaID: id, Err: err})
	}
	if err != nil {
		return nil, err
	}
	return r.build(ctx, id, got)
}

// build makes a Schema of what the registry returned, resolving its
// references.
func (r *Registry) build(ctx context.Context, id int, got sr.Schema) (*Schema, error) {
	s := &Schema{ID: id, Type: typeOf(got.Type), Text: got.Schema}
	seen := map[string]bool{}
	if err := r.resolveRefs(ctx, got.References, seen, &s.refs); err != nil {
		return nil, fmt.Errorf("schema id %d: %w", id, err)
	}
	return s, nil
}

// resolveRefs appends the schemas refs name, each after the schemas it
// references itself, to out.
func (r *Registry) resolveRefs(ctx context.Context, refs []sr.SchemaReference, seen map[string]bool, out *[]ref) error {
	for _, rf := range refs {
		if seen[rf.Name] {
			continue
		}
		seen[rf.Name] = true
		ss, err := r.byReference(ctx, rf)
		if err != nil {
			return err
		}
		if err := r.resolveRefs(ctx, ss.References, seen, out); err != nil {
			return err
		}
		*out = append(*out, ref{name: rf.Name, text: ss.Schema.Schema, typ: typeOf(ss.Type)})
	}
	return nil
}

// byReference returns the schema a reference names (a subject's version,
// which never changes), cached.
func (r *Registry) byReference(ctx context.Context, rf sr.SchemaReference) (sr.SubjectSchema, error) {
	key := sr.SchemaReference{Subject: rf.Subject, Version: rf.Version}
	r.mu.Lock()
	ss, ok := r.byRef[key]
	r.mu.Unlock()
	if ok {
		return ss, nil
	}
	err := r.call(ctx, fmt.Sprintf("reference %q (subject %q version %d)", rf.Name, rf.Subject, rf.Version), func(ctx context.Context) error {
		var err error
		ss, err = r.cl.SchemaByVersion(ctx, rf.Subject, rf.Version)
		return err
	})
	if errors.Is(err, errNotFound) {
		return ss, handler.Decode(&DecodeError{Subject: rf.Subject, Err: fmt.Errorf("reference %q (version %d): %w", rf.Name, rf.Version, err)})
	}
	if err != nil {
		return ss, err
	}
	r.mu.Lock()
	r.byRef[key] = ss
	r.mu.Unlock()
	return ss, nil
}

// subjectOf returns a subject schema id is registered under, for a decode
// error's headers: asked once per id (GET /schemas/ids/{id}/versions), ""
// when the registry does not say or cannot answer now.
func (r *Registry) subjectOf(ctx context.Context, id int) string {
	subject, _ := r.subjectFor(ctx, id)
	return subject
}

// subjectFor is subjectOf with the registry's failure: an
// *UnavailableError (not cached; asked again at the next call), or ctx's.
func (r *Registry) subjectFor(ctx context.Context, id int) (string, error) {
	r.mu.Lock()
	subject, ok := r.subjects[id]
	r.mu.Unlock()
	if ok {
		return subject, nil
	}
	var versions []sr.SubjectVersion
	err := r.call(ctx, fmt.Sprintf("subjects of schema id %d", id), func(ctx context.Context) error {
		var err error
		versions, err = r.cl.SchemaVersionsByID(ctx, id)
		return err
	})
	if err != nil && !errors.Is(err, errNotFound) {
		return "", err
	}
	if len(versions) > 0 {
		subject = versions[0].Subject
	}
	r.mu.Lock()
	r.subjects[id] = subject
	r.mu.Unlock()
	return subject, nil
}

// Latest returns the latest version of subject's schema, kept for
// SubjectTTL. A subject the registry does not know is a handler.Decode
// error wrapping a *DecodeError.
func (r *Registry) Latest(ctx context.Context, subject string) (*Schema, error) {
	r.mu.Lock()
	e, ok := r.latest[subject]
	r.mu.Unlock()
	if ok && time.Since(e.at) < r.cfg.SubjectTTL {
		return e.s, nil
	}
	var ss sr.SubjectSchema
	err := r.call(ctx, fmt.Sprintf("latest version of subject %q", subject), func(ctx context.Context) error {
		var err error
		ss, err = r.cl.SchemaByVersion(ctx, subject, -1)
		return err
	})
	if errors.Is(err, errNotFound) {
		return nil, handler.Decode(&DecodeError{Subject: subject, Err: err})
	}
	if err != nil {
		return nil, err
	}
	s, err := r.adopt(ctx, ss.ID, ss.Schema)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.latest[subject] = latestEntry{s: s, at: time.Now()}
	r.mu.Unlock()
	return s, nil
}

// adopt returns the cached Schema of id, or builds and caches one of got.
func (r *Registry) adopt(ctx context.Context, id int, got sr.Schema) (*Schema, error) {
	r.mu.Lock()
	s, ok := r.byID[id]
	r.mu.Unlock()
	if ok {
		return s, nil
	}
	s, err := r.build(ctx, id, got)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if old, ok := r.byID[id]; ok {
		s = old
	} else {
		r.byID[id] = s
	}
	r.mu.Unlock()
	return s, nil
}

// Register registers text, a schema of type typ ("AVRO", "PROTOBUF",
// "JSON"; "" is AVRO), under subject and returns it with its id. A schema
// already registered under subject is not registered again: the registry
// returns its id. The registry refuses a schema that does not parse, or
// that breaks the subject's compatibility rule, with an error naming why
// (not an *UnavailableError).
func (r *Registry) Register(ctx context.Context, subject, typ, text string) (*Schema, error) {
	in := sr.Schema{Schema: text, Type: schemaType(typOrAvro(typ))}
	var id int
	err := r.call(ctx, fmt.Sprintf("register a schema under subject %q", subject), func(ctx context.Context) error {
		var err error
		id, err = r.cl.RegisterSchema(ctx, subject, in, -1, -1)
		var re *sr.ResponseError
		if errors.As(err, &re) && re.StatusCode < 500 {
			// The registry answered: the schema, not the registry, is at fault.
			return handler.Permanent(err)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return r.adopt(ctx, id, in)
}

func typOrAvro(t string) string {
	if t == "" {
		return typeAvro
	}
	return strings.ToUpper(t)
}

// typeOf names a registry schema type as Schema.Type does.
func typeOf(t sr.SchemaType) string {
	switch t {
	case sr.TypeProtobuf:
		return typeProtobuf
	case sr.TypeJSON:
		return typeJSON
	}
	return typeAvro
}

// schemaType is the inverse of typeOf.
func schemaType(t string) sr.SchemaType {
	switch t {
	case typeProtobuf:
		return sr.TypeProtobuf
	case typeJSON:
		return sr.TypeJSON
	}
	return sr.TypeAvro
}
