package consumer

import (
	"context"
	"time"
)

// WithControlsTiming returns ctx making Run's live controls (Config.Controls)
// beat every beat and re-read their state every reread, for the external
// tests.
func WithControlsTiming(ctx context.Context, beat, reread time.Duration) context.Context {
	return context.WithValue(ctx, controlsTimingKey{}, controlsTiming{beat: beat, reread: reread})
}
