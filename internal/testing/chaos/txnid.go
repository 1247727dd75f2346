package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"time"
)

// txnIDLine matches the line a member in transactional mode logs at start
// with its transactional.id (consumer's "idem: transactional mode").
var txnIDLine = regexp.MustCompile(`msg="idem: transactional mode".* transactional_id=("[^"]+"|\S+)`)

// groupAttr is the group attribute of a member's log line.
var groupAttr = regexp.MustCompile(` group=("[^"]+"|\S+)`)

// liveTransactionalID returns the transactional.id of a random live member
// and that member's name, read from its log, polling until one has logged
// it (a member just restarted may not have yet) for up to timeout.
func (f *fleet) liveTransactionalID(ctx context.Context, timeout time.Duration) (id, name string, err error) {
	deadline := time.Now().Add(timeout)
	for {
		f.mu.Lock()
		var ms []*member
		for _, m := range f.live {
			ms = append(ms, m)
		}
		f.mu.Unlock()
		rand.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
		for _, m := range ms {
			b, _ := os.ReadFile(m.stderr)
			if g := txnIDLine.FindSubmatch(b); g != nil {
				return string(trimQuotes(g[1])), m.name, nil
			}
		}
		if time.Now().After(deadline) {
			return "", "", fmt.Errorf("no live member logged its transactional.id within %s (%d live)", timeout, len(ms))
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return "", "", err
		}
	}
}

// trimQuotes drops the quotes slog puts around a value with spaces.
func trimQuotes(b []byte) []byte {
	if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' {
		return b[1 : len(b)-1]
	}
	return b
}
