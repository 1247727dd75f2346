package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/testing/sealtest"
)

// inChromium logs in to e's console in Chromium with secret and returns the
// text of each page of paths, as a person sees it.
func inChromium(t *testing.T, e *env, secret string, paths ...string) []string {
	t.Helper()
	b := browser(t)
	if err := chromedp.Run(b,
		chromedp.Navigate(e.srv.URL+"/login"),
		chromedp.WaitVisible(`#token`, chromedp.ByID),
		chromedp.SendKeys(`#token`, secret, chromedp.ByID),
		chromedp.Click(`#login`, chromedp.ByID),
		chromedp.WaitVisible(`#overview`, chromedp.ByID),
	); err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(paths))
	for i, p := range paths {
		if err := chromedp.Run(b, chromedp.Navigate(e.srv.URL+p), chromedp.WaitReady(`main`), chromedp.Text(`body`, &out[i])); err != nil {
			t.Fatalf("%s in Chromium: %v", p, err)
		}
	}
	return out
}

// TestRecordUnreadableAfterKeyDestroyed: with encryption on, the indexer
// stores a record's value sealed and the console shows it; once its data
// key is destroyed, the console shows the record as "key destroyed" (API
// and HTML), its value is 410 Gone, and a replay publishes nothing.
func TestRecordUnreadableAfterKeyDestroyed(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.EncryptionKey = sealtest.KEK(t) })
	dlqTopic, origin := e.k.Topic(t, "dlq", 1), e.k.Topic(t, "origin", 1)
	e.seedDLQ(t, dlqTopic, origin, dead{key: "pay-1", value: []byte(`{"id":"pay-1","card":{"number":"4111111111111111"}}`),
		kind: handler.KindPermanent, err: "card declined"})
	e.runIndexer(t, dlqTopic)
	rec := e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 1)[0]
	id := fmt.Sprint(rec.ID)

	var stored []byte
	if err := e.pool.QueryRow(t.Context(), `SELECT value FROM idem_dlq_records WHERE id = $1`, rec.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if rec.KeyID == 0 || bytes.Contains(stored, []byte("pay-1")) {
		t.Fatalf("at rest: key %d value %q, want sealed", rec.KeyID, stored)
	}
	type view struct {
		KeyID              int64  `json:"key_id"`
		PayloadUnavailable string `json:"payload_unavailable"`
		PayloadError       string `json:"payload_error"`
		Value              struct {
			Text        string `json:"text"`
			Unavailable string `json:"unavailable"`
		} `json:"value"`
		Headers []struct{ Key string } `json:"headers"`
	}
	get := func() view {
		t.Helper()
		code, b := e.call(t, "GET", "/api/records/"+id, viewerSecret, nil)
		var v view
		if err := json.Unmarshal(b, &v); code != http.StatusOK || err != nil {
			t.Fatalf("GET record: %d %s", code, b)
		}
		return v
	}
	if v := get(); v.KeyID != rec.KeyID || !strings.Contains(v.Value.Text, "pay-1") || len(v.Headers) == 0 || v.PayloadUnavailable != "" {
		t.Fatalf("sealed record through the console: %+v", v)
	}

	if err := seal.Destroy(t.Context(), e.pool, rec.KeyID, "alice", "erasure request 77"); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		if v := get(); v.PayloadUnavailable != "key destroyed" {
			return fmt.Errorf("record shows %+v", v)
		}
		return nil
	})
	v := get()
	if v.Value.Unavailable != "key destroyed" || v.Value.Text != "" || len(v.Headers) != 0 || !strings.Contains(v.PayloadError, "erasure request 77") {
		t.Errorf("destroyed: %+v", v)
	}
	op := e.login(t, operatorSecret)
	code, page := e.get(t, op, "/records/"+id)
	if code != http.StatusOK || !bytes.Contains(page, []byte(`id="payload-unavailable"`)) || !bytes.Contains(page, []byte("key destroyed")) || bytes.Contains(page, []byte("pay-1&#34;")) {
		t.Errorf("record page: %d\n%s", code, page)
	}
	if text := inChromium(t, e, operatorSecret, "/records/"+id)[0]; !strings.Contains(text, "Payload key destroyed") || strings.Contains(text, "4111") {
		t.Errorf("record page in Chromium:\n%s", text)
	}
	if code, b := e.call(t, "GET", "/api/records/"+id+"/value", operatorSecret, nil); code != http.StatusGone || !bytes.Contains(b, []byte("key destroyed")) {
		t.Errorf("value download: %d %s, want 410 key destroyed", code, b)
	}
	before := e.hwm(t, origin)
	code, b := e.call(t, "POST", "/api/actions/replay", operatorSecret, map[string]any{"ids": []int64{rec.ID}, "reason": "retry"})
	if code != http.StatusOK || !bytes.Contains(b, []byte("key destroyed")) || !bytes.Contains(b, []byte(`"done": 0`)) {
		t.Errorf("replay of a shredded record: %d %s", code, b)
	}
	if after := e.hwm(t, origin); after != before {
		t.Errorf("the replay published %d records", after-before)
	}
	// Still listed, still resolvable: only the payload is gone.
	if code, b := e.call(t, "GET", "/api/records?topic="+dlqTopic, viewerSecret, nil); code != http.StatusOK || !bytes.Contains(b, []byte(`"id": `+id)) {
		t.Errorf("record list: %d %s", code, b)
	}
}

// TestEncryptionKeyRefused: New refuses a key file that others may read,
// without reading it, and a key that does not unwrap the index's data keys,
// naming both KEK ids.
func TestEncryptionKeyRefused(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.EncryptionKey = sealtest.KEK(t) })
	dlqTopic, origin := e.k.Topic(t, "dlq", 1), e.k.Topic(t, "origin", 1)
	e.seedDLQ(t, dlqTopic, origin, dead{key: "pay-1", value: []byte(`{}`), kind: handler.KindPermanent, err: "e"})
	e.runIndexer(t, dlqTopic)
	e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 1)

	cfg := Config{Pool: e.pool, Client: e.client, Tokens: []Token{{Name: "a", Role: Admin, Secret: adminSecret}}}
	cfg.EncryptionKey = sealtest.KEK(t)
	_, err := New(cfg)
	if !errors.Is(err, seal.ErrWrongKEK) || strings.Count(err.Error(), "KEK id") < 2 {
		t.Errorf("New with another key: %v, want ErrWrongKEK naming the KEK ids", err)
	}
	cfg.EncryptionKey = ""
	cfg.EncryptionKeyFile = filepath.Join(t.TempDir(), "kek")
	if err := os.WriteFile(cfg.EncryptionKeyFile, []byte(e.kek+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); !errors.Is(err, seal.ErrBadKEK) || !strings.Contains(err.Error(), "chmod 600") || strings.Contains(err.Error(), e.kek) {
		t.Errorf("New with a world-readable key file: %v", err)
	}
	if err := os.Chmod(cfg.EncryptionKeyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err != nil {
		t.Errorf("New with the right key file: %v", err)
	}
}
