package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// KeySize is the size of a key-encryption key and of a data key: 32 bytes,
// for AES-256.
const KeySize = 32

// KEK is a key-encryption key: it wraps (encrypts) the data keys kept in
// idem_seal_keys and never reaches the database itself. Its ID, an HMAC of
// the key, is stored beside each key it wraps; it identifies the KEK
// without revealing it. The zero KEK is not usable.
type KEK struct {
	id   string
	aead cipher.AEAD
}

// ID returns the KEK's identifier: 16 hexadecimal digits of
// HMAC-SHA256(key, "idem kek id"). It is safe to log.
func (k KEK) ID() string { return k.id }

// NewKEK returns the KEK of key, which must be KeySize random bytes.
func NewKEK(key []byte) (KEK, error) {
	if len(key) != KeySize {
		return KEK{}, fmt.Errorf("seal: a key-encryption key has %d bytes, not %d", KeySize, len(key))
	}
	aead, err := newAEAD(key)
	if err != nil {
		return KEK{}, err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("idem kek id"))
	return KEK{id: hex.EncodeToString(mac.Sum(nil)[:8]), aead: aead}, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return cipher.NewGCM(block)
}

// GenerateKEK returns a new random key-encryption key as text, in the form
// ParseKEKs reads (standard base64), and its ID.
func GenerateKEK() (text, id string, err error) {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return "", "", fmt.Errorf("seal: random key: %w", err)
	}
	k, err := NewKEK(key)
	if err != nil {
		return "", "", err
	}
	return base64.StdEncoding.EncodeToString(key), k.ID(), nil
}

// RandomKEK returns a new random key-encryption key, for tests and
// benchmarks; an operator's KEK comes from a file or the environment.
func RandomKEK() (KEK, error) {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return KEK{}, fmt.Errorf("seal: random key: %w", err)
	}
	return NewKEK(key)
}

// ErrBadKEK is wrapped by the errors of ParseKEKs and LoadKEKFile for text
// that holds no usable key. The error never quotes the text: it may be a
// key with a typo.
var ErrBadKEK = errors.New("seal: bad key-encryption key")

// ParseKEKs reads key-encryption keys from text: one key a line (or
// separated by commas, as an environment variable holds them), each
// KeySize bytes written in base64 (standard or URL alphabet, padded or not)
// or in hexadecimal. Blank lines and lines starting with # are skipped. The
// first key wraps new data keys; the others only unwrap keys they wrapped
// earlier (during a rotation, see Rotate). A key given twice is refused.
func ParseKEKs(text string) ([]KEK, error) {
	var out []KEK
	seen := map[string]bool{}
	n := 0
	var entries []string
	for _, line := range strings.Split(text, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			entries = append(entries, strings.Split(line, ",")...)
		}
	}
	for _, line := range entries {
		n++
		line = strings.TrimSpace(line)
		key, ok := decodeKey(line)
		if !ok {
			return nil, fmt.Errorf("%w: entry %d (%d characters) is not %d bytes in base64 or hexadecimal", ErrBadKEK, n, len(line), KeySize)
		}
		k, err := NewKEK(key)
		if err != nil {
			return nil, err
		}
		if seen[k.id] {
			return nil, fmt.Errorf("%w: entry %d repeats the key of KEK id %s", ErrBadKEK, n, k.id)
		}
		seen[k.id] = true
		out = append(out, k)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no key found (write %d random bytes in base64, e.g. idem keys generate)", ErrBadKEK, KeySize)
	}
	return out, nil
}

func decodeKey(s string) ([]byte, bool) {
	if b, err := hex.DecodeString(s); err == nil && len(b) == KeySize {
		return b, true
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil && len(b) == KeySize {
			return b, true
		}
	}
	return nil, false
}

// LoadKEKFile reads the key-encryption keys of the file at path
// (ParseKEKs). It refuses a file that is not a regular file, or whose
// permissions let others than its owner and group read it, or its group
// write it (chmod 600 or 400; 640 is accepted): the error says so and
// reads nothing.
func LoadKEKFile(path string) ([]KEK, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("seal: key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: key file %s is not a regular file", ErrBadKEK, path)
	}
	if perm := fi.Mode().Perm(); perm&0o027 != 0 {
		return nil, fmt.Errorf("%w: key file %s has mode %04o: others may read it or its group may write it; run chmod 600 %s",
			ErrBadKEK, path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("seal: key file: %w", err)
	}
	ks, err := ParseKEKs(string(b))
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return ks, nil
}

// LoadKEKs returns the key-encryption keys of file when file is not "",
// else of text (an environment variable's value, e.g. IDEM_ENCRYPTION_KEY);
// nil, nil when both are empty (encryption off). Giving both is an error.
func LoadKEKs(file, text string) ([]KEK, error) {
	switch {
	case file != "" && text != "":
		return nil, errors.New("seal: give the key-encryption key in a file or in the environment, not both")
	case file != "":
		return LoadKEKFile(file)
	case text != "":
		return ParseKEKs(text)
	}
	return nil, nil
}
