package payments

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// progress shows the demo's progress: on a terminal one line redrawn in
// place (a bar and the live counts), otherwise a plain line every interval.
type progress struct {
	w        io.Writer
	tty      bool
	every    time.Duration
	total    int64
	reg      prometheus.Gatherer
	group    string
	start    time.Time
	lastLine time.Time
	drawn    bool
	flow     flowProgress // the bank's calls/s and throttles (flow.go)
}

func newProgress(w io.Writer, every time.Duration, total int64, reg prometheus.Gatherer, group string) *progress {
	return &progress{w: w, tty: isTerminal(w), every: every, total: total, reg: reg, group: group, start: time.Now()}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// breakerNames are idem_breaker_state's values.
var breakerNames = map[int64]string{0: "closed", 1: "half-open", 2: "OPEN"}

// update shows the state once sent records were produced. A record is done
// when its outcome is final: processed, duplicate or dead-lettered (one sent
// to a retry tier is done when it comes back and ends one of those ways).
func (p *progress) update(sent int64) {
	now := time.Now()
	if !p.tty && now.Sub(p.lastLine) < p.every {
		return
	}
	p.lastLine = now
	g := gathered(p.reg)
	out := func(o string) int64 { return g.sum("idem_messages_total", "outcome", o) }
	done := out("processed") + out("duplicate") + out("dead_lettered")
	bank := "closed"
	if st, ok := g.find("idem_breaker_state", "name", "bank"); ok {
		bank = breakerNames[st]
	}
	stats := fmt.Sprintf("%s/%s done · bank %s%s · %s applied · %s dup · %s DLQ · %s to tiers · %s retries · %s sent",
		num(done), num(p.total), bank, p.flow.stats(g, now), num(out("processed")), num(out("duplicate")), num(out("dead_lettered")),
		num(out("retried")), num(g.sum("idem_retries_total", "", "")), num(sent))
	el := now.Sub(p.start).Truncate(100 * time.Millisecond)
	if !p.tty {
		fmt.Fprintf(p.w, "  %5.1fs  %s\n", el.Seconds(), stats)
		return
	}
	const width = 20
	frac := float64(done) / float64(max(1, p.total))
	bar := strings.Repeat("█", int(frac*width)) + strings.Repeat("░", width-int(frac*width))
	line := []rune(fmt.Sprintf("  %s %3.0f%% %5.1fs  %s", bar, frac*100, el.Seconds(), stats))
	if cols := termWidth(p.w.(*os.File)) - 1; len(line) > cols {
		line = append(line[:max(0, cols-1)], '…') // a wrapped line could not be redrawn in place
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s", string(line))
	p.drawn = true
}

// done ends the live line.
func (p *progress) done() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

// clearingWriter clears the terminal's current line before each write, so a
// log line does not land in the middle of the progress bar (redrawn on the
// next tick).
type clearingWriter struct{ w io.Writer }

func (c clearingWriter) Write(b []byte) (int, error) {
	if _, err := io.WriteString(c.w, "\r\x1b[K"); err != nil {
		return 0, err
	}
	return c.w.Write(b)
}
