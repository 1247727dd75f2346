package seal

import (
	"bytes"
	"testing"
	"time"
)

// BenchmarkSealOpen measures the CPU cost of sealing and of opening one
// dead letter as the failure index stores it: a 250-byte value and 450
// bytes of headers, two AES-256-GCM operations each way (no database).
//
//	go test -run '^$' -bench SealOpen ./internal/seal
func BenchmarkSealOpen(b *testing.B) {
	raw := bytes.Repeat([]byte{9}, KeySize)
	aead, err := newAEAD(raw)
	if err != nil {
		b.Fatal(err)
	}
	k := &Key{&dataKey{id: 1, aead: aead, created: time.Now()}}
	value, headers := bytes.Repeat([]byte("v"), 250), bytes.Repeat([]byte("h"), 450)
	aad := []byte("idem_dlq_records\x00value\x00payments.billing.dlq\x000\x0042")
	b.Run("seal", func(b *testing.B) {
		b.SetBytes(int64(len(value) + len(headers)))
		for b.Loop() {
			_ = k.Seal(value, aad)
			_ = k.Seal(headers, aad)
		}
	})
	sv, sh := k.Seal(value, aad), k.Seal(headers, aad)
	b.Run("open", func(b *testing.B) {
		b.SetBytes(int64(len(value) + len(headers)))
		for b.Loop() {
			if _, err := openWith(aead, sv, aad); err != nil {
				b.Fatal(err)
			}
			if _, err := openWith(aead, sh, aad); err != nil {
				b.Fatal(err)
			}
		}
	})
}
