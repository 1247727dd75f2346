package breaker

import (
	"context"
	"fmt"
	"sync"
)

// Set holds named breakers, one per dependency ("bank-api", "ledger-db"…),
// each created on first use. It is safe for concurrent use. The zero Set is
// ready to use, with the zero Settings (DefaultSettings).
type Set struct {
	base Settings // as given to NewSet, before defaults

	mu        sync.Mutex
	overrides map[string]Settings // per-name Settings, merged with base, before defaults
	breakers  map[string]*Breaker
}

// NewSet returns an empty Set whose breakers use s. Zero fields of s take the
// values of DefaultSettings. It returns an error matching ErrInvalidSettings
// if s.Validate fails.
func NewSet(s Settings) (*Set, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &Set{base: s}, nil
}

// Configure sets the Settings of the breaker called name, which must not have
// been created yet (by Get or Do). Zero fields of st take the Set's
// Settings (as given to NewSet), and the zero fields of those take
// DefaultSettings; so an override need only name what differs, and it keeps
// the Set's OnStateChange unless it sets its own. A later Configure of the
// same name replaces an earlier one.
//
// It returns an error wrapping ErrInUse if the breaker exists, or matching
// ErrInvalidSettings if the merged Settings do not Validate.
func (s *Set) Configure(name string, st Settings) error {
	merged := st.withDefaults(s.base)
	if err := merged.Validate(); err != nil {
		return fmt.Errorf("breaker: Configure(%q): %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.breakers[name]; ok {
		return fmt.Errorf("breaker: Configure(%q): %w; configure it before its first use", name, ErrInUse)
	}
	if s.overrides == nil {
		s.overrides = make(map[string]Settings)
	}
	s.overrides[name] = merged
	return nil
}

// Get returns the breaker called name, creating it (closed) on first use.
func (s *Set) Get(name string) *Breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.breakers[name]; ok {
		return b
	}
	st, ok := s.overrides[name]
	if !ok {
		st = s.base
	}
	b := newBreaker(name, st.withDefaults(DefaultSettings()))
	if s.breakers == nil {
		s.breakers = make(map[string]*Breaker)
	}
	s.breakers[name] = b
	return b
}

// Do is s.Get(name).Do(ctx, fn); see Breaker.Do for the exact semantics.
func (s *Set) Do(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	return s.Get(name).Do(ctx, fn)
}

// States returns the current state of every breaker created so far, by name.
// Like Breaker.State, it may move breakers whose cool-down is over to
// half-open.
func (s *Set) States() map[string]State {
	s.mu.Lock()
	bs := make([]*Breaker, 0, len(s.breakers))
	for _, b := range s.breakers {
		bs = append(bs, b)
	}
	s.mu.Unlock()
	out := make(map[string]State, len(bs))
	for _, b := range bs {
		out[b.name] = b.State()
	}
	return out
}
