package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/mask"
)

// masker is the dlq commands' --mask: inactive without paths.
func (a *app) masker() (*mask.Masker, error) {
	m, err := mask.New(a.mask)
	if err != nil {
		return nil, fmt.Errorf("--mask: %w", err)
	}
	return m, nil
}

// maskValue is v as a viewer may see it: masked by m's paths (sc scrubbing
// the other strings), or, when v is not JSON, a note saying it is hidden.
// nil (a tombstone or a stub) stays nil.
func maskValue(m *mask.Masker, sc *mask.Scrubber, v []byte) []byte {
	if !m.Active() || v == nil {
		return v
	}
	out, _, err := m.Payload(v, sc)
	if err != nil {
		return fmt.Appendf(nil, "(%d bytes, not JSON: hidden because --mask is on)", len(v))
	}
	return out
}

// maskHeaders scrubs every header value with sc.
func maskHeaders(sc *mask.Scrubber, hs []sarama.RecordHeader) []sarama.RecordHeader {
	out := make([]sarama.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = sarama.RecordHeader{Key: h.Key, Value: sc.Header(string(h.Key), h.Value)}
	}
	return out
}

// maskDLQRecord returns r as --mask shows it: the payload masked, and the
// values masked there, and card numbers, replaced in the key and every
// header (so in the decoded error, stack and idempotency key too).
func maskDLQRecord(m *mask.Masker, r *dlq.Record) *dlq.Record {
	if !m.Active() {
		return r
	}
	sc := m.For(r.Value)
	msg := &sarama.ConsumerMessage{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp,
		Key: sc.Bytes(r.Key), Value: maskValue(m, sc, r.Value)}
	for _, h := range maskHeaders(sc, r.Headers) {
		msg.Headers = append(msg.Headers, &h)
	}
	return dlq.FromMessage(msg)
}

// maskJobs returns js as --mask shows them: no card number in what an
// operator typed (reason, filter) or in the errors, as the console's jobs
// and audit pages show them (no payload is at hand there).
func maskJobs(m *mask.Masker, js []failidx.Job) []failidx.Job {
	if !m.Active() {
		return js
	}
	sc := m.For()
	out := make([]failidx.Job, len(js))
	for i, j := range js {
		j.Reason, j.Detail = sc.String(j.Reason), sc.String(j.Detail)
		j.Errors = make([]string, len(js[i].Errors))
		for k, e := range js[i].Errors {
			j.Errors[k] = sc.String(e)
		}
		out[i] = j
	}
	return out
}

// maskIndexRecord returns r as --mask shows it: as maskDLQRecord, with the
// index's own text (error, stack, keys, status reason) and each edited
// version scrubbed by the values masked in any of the record's payloads.
func maskIndexRecord(m *mask.Masker, r failidx.Record) failidx.Record {
	if !m.Active() {
		return r
	}
	payloads := [][]byte{r.Value}
	for _, v := range r.Versions {
		payloads = append(payloads, v.Value)
	}
	sc := m.For(payloads...)
	r.Key, r.IdempotencyKey = sc.Bytes(r.Key), sc.String(r.IdempotencyKey)
	r.Error, r.ErrorType, r.Stack, r.StatusReason = sc.String(r.Error), sc.String(r.ErrorType), sc.String(r.Stack), sc.String(r.StatusReason)
	r.Value = maskValue(m, sc, r.Value)
	hs := make([]failidx.Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = failidx.Header{Key: h.Key, Value: sc.Header(string(h.Key), h.Value)}
	}
	r.Headers = hs
	vs := make([]failidx.Version, len(r.Versions))
	for i, v := range r.Versions {
		v.Value, v.Reason = maskValue(m, sc, v.Value), sc.String(v.Reason)
		vs[i] = v
	}
	r.Versions = vs
	return r
}

// maskIndexList scrubs a list of the index with m: each record's error and
// keys by the values masked in its own stored value, each group's sample
// error by its sample record's (registry values decoded: a.maskable).
func (a *app) maskIndexList(ctx context.Context, m *mask.Masker, s *failidx.Store, groups []failidx.FailureGroup, recs []failidx.Record) error {
	if !m.Active() {
		return nil
	}
	ids := make([]int64, 0, len(groups)+len(recs))
	for _, g := range groups {
		ids = append(ids, g.SampleID)
	}
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	vals, err := s.Values(ctx, ids)
	if err != nil {
		return err
	}
	for i, g := range groups {
		groups[i].SampleError = m.For(a.maskable(ctx, vals[g.SampleID])).String(g.SampleError)
	}
	for i, r := range recs {
		sc := m.For(a.maskable(ctx, vals[r.ID]))
		recs[i].Error, recs[i].IdempotencyKey, recs[i].Key = sc.String(r.Error), sc.String(r.IdempotencyKey), sc.Bytes(r.Key)
	}
	return nil
}

// showUnreadable prints what the index knows of a record whose value and
// headers cannot be read (its data key destroyed, …): the columns it keeps
// in clear, and why.
func showUnreadable(w io.Writer, r failidx.Record) {
	fmt.Fprintf(w, "record:    %s partition %d offset %d\n", r.Topic, r.Partition, r.Offset)
	fmt.Fprintf(w, "key:       %q\n", r.Key)
	fmt.Fprintf(w, "fingerprint: %s\n", r.Fingerprint)
	fmt.Fprintln(w, "failure (as the index keeps it):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, row := range [][2]string{
		{"kind", text(r.Kind)}, {"error-type", text(r.ErrorType)}, {"error", text(r.Error)}, {"attempt", fmt.Sprint(r.Attempts)},
		{"original", fmt.Sprintf("%s partition %d offset %d", orDash(text(r.OriginTopic)), r.OriginPartition, r.OriginOffset)},
		{"consumer-group", text(r.Group)}, {"first-failure-at", fmtTime(r.FirstFailureAt)}, {"last-failure-at", fmtTime(r.LastFailureAt)},
	} {
		fmt.Fprintf(tw, "  %s\t%s\n", row[0], orDash(row[1]))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "payload:   %s: the value and headers cannot be read (%s)\n", failidx.Unavailable(r.PayloadErr), text(oneLine(r.PayloadErr.Error())))
}

// maskGroups scrubs each group's sample error with m by the values masked
// in its sample record's value, read from the topic (a registry value
// decoded: a.maskable).
func (a *app) maskGroups(ctx context.Context, m *mask.Masker, cl *dlq.Client, topic string, groups []dlq.Group) error {
	if !m.Active() {
		return nil
	}
	for i, g := range groups {
		r, err := cl.Show(ctx, topic, dlq.Position{Partition: g.SamplePartition, Offset: g.SampleOffset})
		if err != nil {
			return fmt.Errorf("read group %s's sample to mask it: %w", g.Fingerprint, err)
		}
		groups[i].SampleError = m.For(a.maskable(ctx, r.Value)).String(g.SampleError)
	}
	return nil
}
