package seal

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/testing/testenv"
)

// kek returns a new random KEK and its text.
func kek(t *testing.T) (KEK, string) {
	t.Helper()
	text, id, err := GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	ks, err := ParseKEKs(text)
	if err != nil || len(ks) != 1 || ks[0].ID() != id {
		t.Fatalf("ParseKEKs(GenerateKEK()): %v %v", ks, err)
	}
	return ks[0], text
}

func TestParseKEKs(t *testing.T) {
	key := bytes.Repeat([]byte{0xab}, KeySize)
	hexKey := hex.EncodeToString(key)
	one, err := ParseKEKs(hexKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{
		"q6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=", // standard base64
		"q6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s",  // unpadded
		"# the key, in hex\n\n  " + hexKey + "  \n",
	} {
		ks, err := ParseKEKs(text)
		if err != nil || len(ks) != 1 || ks[0].ID() != one[0].ID() {
			t.Errorf("ParseKEKs(%q): %v, %v; want KEK id %s", text, ks, err, one[0].ID())
		}
	}
	_, other := kek(t)
	ks, err := ParseKEKs(other + "," + hexKey)
	if err != nil || len(ks) != 2 || ks[1].ID() != one[0].ID() {
		t.Errorf("two keys: %v %v", ks, err)
	}
	// Bad text: the error never quotes it (it may be a key with a typo).
	secretish := strings.Repeat("Zm9v", 10) + "!!"
	for _, text := range []string{"", "# only a comment", secretish, hexKey[:60], hexKey + "\n" + hexKey} {
		_, err := ParseKEKs(text)
		if !errors.Is(err, ErrBadKEK) {
			t.Errorf("ParseKEKs(%q): %v, want ErrBadKEK", text, err)
		}
		if err != nil && text != "" && strings.Contains(err.Error(), strings.TrimSpace(strings.Split(text, "\n")[0])) {
			t.Errorf("the error quotes the key: %v", err)
		}
	}
}

func TestLoadKEKFile(t *testing.T) {
	dir := t.TempDir()
	_, text := kek(t)
	path := filepath.Join(dir, "kek")
	for _, c := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o600, true}, {0o400, true}, {0o640, true}, {0o644, false}, {0o604, false}, {0o660, false}, {0o666, false}} {
		if err := os.WriteFile(path, []byte(text+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, c.mode); err != nil {
			t.Fatal(err)
		}
		ks, err := LoadKEKFile(path)
		switch {
		case c.ok && (err != nil || len(ks) != 1):
			t.Errorf("mode %04o: %v", c.mode, err)
		case !c.ok && (!errors.Is(err, ErrBadKEK) || !strings.Contains(err.Error(), "chmod 600")):
			t.Errorf("mode %04o: %v, want a refusal that says chmod 600", c.mode, err)
		}
		_ = os.Remove(path)
	}
	if _, err := LoadKEKFile(dir); !errors.Is(err, ErrBadKEK) {
		t.Errorf("a directory: %v", err)
	}
	if ks, err := LoadKEKs("", ""); ks != nil || err != nil {
		t.Errorf("LoadKEKs with nothing: %v %v, want encryption off", ks, err)
	}
	if _, err := LoadKEKs(path, text); err == nil {
		t.Error("LoadKEKs with a file and a text: no error")
	}
}

// keysDB returns a pool on a schema of its own with idem_seal_keys.
func keysDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, _ := testenv.PostgresSchema(t)
	if err := Migrate(testenv.Context(t), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// sealIn seals plaintext in a transaction of its own.
func sealIn(t *testing.T, pool *pgxpool.Pool, s *Sealer, plaintext, aad []byte) ([]byte, int64) {
	t.Helper()
	var ct []byte
	var id int64
	err := pgx.BeginFunc(testenv.Context(t), pool, func(tx pgx.Tx) error {
		var err error
		ct, id, err = s.Seal(testenv.Context(t), tx, plaintext, aad)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ct, id
}

// TestRoundTripTamperAndWrongKEK: what Seal sealed opens with the same
// additional data; a changed byte, other additional data or a cut value is
// ErrTampered; a Sealer given another KEK is refused at New.
func TestRoundTripTamperAndWrongKEK(t *testing.T) {
	pool := keysDB(t)
	ctx := testenv.Context(t)
	k1, _ := kek(t)
	s, err := New(ctx, Config{DB: pool, KEKs: []KEK{k1}, Purpose: "test"})
	if err != nil {
		t.Fatal(err)
	}
	value := []byte(`{"card":"4111111111111111"}`)
	aad := []byte("t/0/42/value")
	ct, id := sealIn(t, pool, s, value, aad)
	if bytes.Contains(ct, []byte("4111")) || len(ct) != len(value)+Overhead {
		t.Fatalf("sealed: %q (%d bytes)", ct, len(ct))
	}
	got, err := s.Open(ctx, id, ct, aad)
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Open: %q %v", got, err)
	}
	empty, _ := sealIn(t, pool, s, []byte{}, aad)
	if got, err := s.Open(ctx, id, empty, aad); err != nil || got == nil || len(got) != 0 {
		t.Errorf("empty value: %q %v, want empty and not nil", got, err)
	}
	// The same key for the next row: one key per purpose and period.
	if _, id2 := sealIn(t, pool, s, value, aad); id2 != id {
		t.Errorf("second seal under key %d, want %d", id2, id)
	}

	flipped := bytes.Clone(ct)
	flipped[len(flipped)/2] ^= 1
	for name, c := range map[string]struct{ ct, aad []byte }{
		"a flipped byte":    {flipped, aad},
		"another row's aad": {ct, []byte("t/0/43/value")},
		"cut":               {ct[:len(ct)-1], aad},
		"too short":         {ct[:5], aad},
	} {
		if _, err := s.Open(ctx, id, c.ct, c.aad); !errors.Is(err, ErrTampered) {
			t.Errorf("%s: %v, want ErrTampered", name, err)
		}
	}

	k2, _ := kek(t)
	_, err = New(ctx, Config{DB: pool, KEKs: []KEK{k2}, Purpose: "test"})
	if !errors.Is(err, ErrWrongKEK) || !strings.Contains(err.Error(), k1.ID()) || !strings.Contains(err.Error(), k2.ID()) {
		t.Errorf("New with another KEK: %v, want ErrWrongKEK naming both KEK ids", err)
	}
	// Another purpose has keys of its own: k2 starts there.
	if _, err := New(ctx, Config{DB: pool, KEKs: []KEK{k2}, Purpose: "other"}); err != nil {
		t.Errorf("New for another purpose: %v", err)
	}
}

// TestRotateKeepsRowsReadable: after Rotate to a new KEK, a Sealer holding
// only the new KEK opens what was sealed before; one holding only the old
// KEK is refused, and its writes fail rather than start a key the new KEK
// cannot unwrap.
func TestRotateKeepsRowsReadable(t *testing.T) {
	pool := keysDB(t)
	ctx := testenv.Context(t)
	old, _ := kek(t)
	s, err := New(ctx, Config{DB: pool, KEKs: []KEK{old}, Purpose: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ct, id := sealIn(t, pool, s, []byte("payload"), nil)
	if _, err := Roll(ctx, pool, old, "test"); err != nil {
		t.Fatal(err)
	}
	ct2, id2 := sealIn(t, pool, s, []byte("payload 2"), nil)
	if id2 == id {
		t.Fatal("Roll did not start a new key")
	}

	next, _ := kek(t)
	stranger, _ := kek(t)
	if _, err := Rotate(ctx, pool, []KEK{stranger}, next); !errors.Is(err, ErrWrongKEK) {
		t.Fatalf("Rotate without the old KEK: %v, want ErrWrongKEK", err)
	}
	res, err := Rotate(ctx, pool, []KEK{old}, next)
	if err != nil || res.Rewrapped != 2 {
		t.Fatalf("Rotate: %+v %v", res, err)
	}
	if res, err := Rotate(ctx, pool, []KEK{old}, next); err != nil || res.Already != 2 || res.Rewrapped != 0 {
		t.Errorf("Rotate again: %+v %v", res, err)
	}
	fresh, err := New(ctx, Config{DB: pool, KEKs: []KEK{next}, Purpose: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for id, ct := range map[int64][]byte{id: ct, id2: ct2} {
		if _, err := fresh.Open(ctx, id, ct, nil); err != nil {
			t.Errorf("after rotation, key %d: %v", id, err)
		}
	}
	if _, err := New(ctx, Config{DB: pool, KEKs: []KEK{old}, Purpose: "test"}); !errors.Is(err, ErrWrongKEK) {
		t.Errorf("New with the retired KEK: %v, want ErrWrongKEK", err)
	}
	// The process that started with the old KEK: its writes fail.
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_seal_keys`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	s.cfg.CacheTTL = time.Nanosecond
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, _, err := s.Seal(ctx, tx, []byte("x"), nil)
		return err
	})
	if !errors.Is(err, ErrWrongKEK) {
		t.Errorf("seal with the retired KEK: %v, want ErrWrongKEK", err)
	}
	var after int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_seal_keys`).Scan(&after); err != nil || after != n {
		t.Errorf("%d keys after a refused seal, want %d", after, n)
	}
}

// TestDestroyShreds: after Destroy, what a key sealed cannot be opened, by
// a new Sealer or by one that had the key cached (after CacheTTL); the
// next write starts a new key; destroying twice is an error.
func TestDestroyShreds(t *testing.T) {
	pool := keysDB(t)
	ctx := testenv.Context(t)
	k, _ := kek(t)
	s, err := New(ctx, Config{DB: pool, KEKs: []KEK{k}, Purpose: "test", CacheTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ct, id := sealIn(t, pool, s, []byte("card 4111111111111111"), nil)
	if _, err := s.Open(ctx, id, ct, nil); err != nil {
		t.Fatal(err)
	}
	if err := Destroy(ctx, pool, id, "", "why"); err == nil {
		t.Error("Destroy without an actor: no error")
	}
	if err := Destroy(ctx, pool, id, "alice", "customer asked to be forgotten"); err != nil {
		t.Fatal(err)
	}
	if err := Destroy(ctx, pool, id, "alice", "again"); !errors.Is(err, ErrNoSuchKey) {
		t.Errorf("Destroy again: %v, want ErrNoSuchKey", err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		_, err := s.Open(ctx, id, ct, nil)
		if !errors.Is(err, ErrKeyDestroyed) {
			return errors.New("still opens")
		}
		if !strings.Contains(err.Error(), "alice") {
			t.Errorf("error does not say who destroyed it: %v", err)
		}
		return nil
	})
	fresh, err := New(ctx, Config{DB: pool, KEKs: []KEK{k}, Purpose: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Open(ctx, id, ct, nil); !errors.Is(err, ErrKeyDestroyed) {
		t.Errorf("new Sealer: %v, want ErrKeyDestroyed", err)
	}
	if _, id2 := sealIn(t, pool, s, []byte("next"), nil); id2 == id {
		t.Error("a write after Destroy used the destroyed key")
	}
	keys, err := Keys(ctx, pool)
	if err != nil || len(keys) != 2 || keys[0].DestroyedBy != "alice" || keys[0].KEKID != "" || keys[1].KEKID != k.ID() {
		t.Errorf("Keys: %+v %v", keys, err)
	}
	var wrapped []byte
	if err := pool.QueryRow(ctx, `SELECT wrapped_key FROM idem_seal_keys WHERE key_id = $1`, id).Scan(&wrapped); err != nil || wrapped != nil {
		t.Errorf("destroyed key's wrapped bytes: %x %v, want NULL", wrapped, err)
	}
}

// TestCurrentHoldsOffDestroy: a writer's transaction holds its key (FOR
// SHARE), so Destroy waits for it; and MaxKeyAge starts a new key.
func TestCurrentHoldsOffDestroy(t *testing.T) {
	pool := keysDB(t)
	ctx := testenv.Context(t)
	k, _ := kek(t)
	s, err := New(ctx, Config{DB: pool, KEKs: []KEK{k}, Purpose: "test", MaxKeyAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	_, first := sealIn(t, pool, s, []byte("x"), nil) // the key exists, committed
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	key, err := s.Current(ctx, tx)
	if err != nil || key.ID() != first {
		t.Fatalf("Current: %v %v, want key %d", key, err, first)
	}
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx2.Rollback(context.Background()) }()
	if _, err := tx2.Exec(ctx, `SET LOCAL lock_timeout = '200ms'`); err != nil {
		t.Fatal(err)
	}
	if err := Destroy(ctx, tx2, key.ID(), "alice", "test"); err == nil || !strings.Contains(err.Error(), "lock timeout") {
		t.Errorf("Destroy while a writer holds the key: %v, want a lock timeout", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A key older than MaxKeyAge: the next writer starts another.
	s.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if _, id := sealIn(t, pool, s, []byte("x"), nil); id == key.ID() {
		t.Error("a key older than MaxKeyAge still seals")
	}
}
