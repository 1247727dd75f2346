package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/failidx"
)

// TestAPIReads reads the JSON API the way a script would: the overview per
// group and topic, failure groups with counts, kind, first and last seen
// and a sample error, records by each filter (group, topic, kind,
// fingerprint, key, error text, time range, status) with cursor paging, one
// record with its headers, error and masked payload, the audit log and the
// failed outbox rows.
func TestAPIReads(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Mask = []string{"card.number"} })
	dlqTopic, origin := e.k.Topic(t, "dlq", 1), e.k.Topic(t, "origin", 1)
	var ds []dead
	for i := 1; i <= 3; i++ {
		ds = append(ds, dead{key: fmt.Sprint("pay-", i), value: fmt.Appendf(nil, `{"id":"pay-%d","card":{"number":"4111111111111111"}}`, i),
			kind: handler.KindPermanent, err: "card declined"})
	}
	for i := 1; i <= 2; i++ {
		ds = append(ds, dead{key: fmt.Sprint("bad-", i), value: []byte(`{"id":`), kind: handler.KindDecode, err: "unexpected end of JSON input"})
	}
	e.seedDLQ(t, dlqTopic, origin, ds...)
	e.runIndexer(t, dlqTopic)
	e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 5)

	get := func(path string, v any) {
		t.Helper()
		code, b := e.call(t, "GET", path, viewerSecret, nil)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, b)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, b)
		}
	}
	type rec struct {
		ID            int64     `json:"id"`
		Kind          string    `json:"kind"`
		Key           string    `json:"key"`
		Status        string    `json:"status"`
		Fingerprint   string    `json:"fingerprint"`
		LastFailureAt time.Time `json:"last_failure_at"`
	}
	records := func(q url.Values) []rec {
		t.Helper()
		q.Set("topic", dlqTopic)
		var page struct {
			Records []rec  `json:"records"`
			Next    string `json:"next"`
		}
		get("/api/records?"+q.Encode(), &page)
		return page.Records
	}
	keys := func(rs []rec) []string {
		var ks []string
		for _, r := range rs {
			ks = append(ks, r.Key)
		}
		slices.Sort(ks)
		return ks
	}

	var ov struct {
		Topics []struct {
			Group, Topic           string
			Unresolved             int     `json:"unresolved"`
			OldestUnresolvedAgeSec float64 `json:"oldest_unresolved_age_seconds"`
		} `json:"topics"`
	}
	get("/api/overview", &ov)
	if len(ov.Topics) != 1 || ov.Topics[0].Group != "billing" || ov.Topics[0].Topic != dlqTopic || ov.Topics[0].Unresolved != 5 || ov.Topics[0].OldestUnresolvedAgeSec < 3000 {
		t.Errorf("overview: %+v, want billing %s with 5 unresolved, the oldest about an hour old", ov.Topics, dlqTopic)
	}

	var gs struct {
		Groups []struct {
			Fingerprint, Kind, Group, Topic string
			SampleError                     string    `json:"sample_error"`
			Count                           int       `json:"count"`
			Unresolved                      int       `json:"unresolved"`
			FirstSeen                       time.Time `json:"first_seen"`
			LastSeen                        time.Time `json:"last_seen"`
		} `json:"groups"`
	}
	get("/api/groups?topic="+url.QueryEscape(dlqTopic), &gs)
	if len(gs.Groups) != 2 {
		t.Fatalf("groups: %+v, want 2", gs.Groups)
	}
	declined := gs.Groups[0]
	if declined.Kind != "permanent" {
		declined = gs.Groups[1]
	}
	if declined.Kind != "permanent" || declined.Count != 3 || declined.Unresolved != 3 || declined.SampleError != "card declined" ||
		declined.Group != "billing" || declined.FirstSeen.IsZero() || declined.LastSeen.Before(declined.FirstSeen) {
		t.Errorf("the card-declined group: %+v", declined)
	}

	all := records(url.Values{})
	slices.SortFunc(all, func(a, b rec) int { return a.LastFailureAt.Compare(b.LastFailureAt) })
	third := all[2].LastFailureAt.Format(time.RFC3339Nano)
	for _, tt := range []struct {
		q    url.Values
		want []string
	}{
		{url.Values{}, []string{"bad-1", "bad-2", "pay-1", "pay-2", "pay-3"}},
		{url.Values{"group": {"billing"}}, []string{"bad-1", "bad-2", "pay-1", "pay-2", "pay-3"}},
		{url.Values{"group": {"ledger"}}, nil},
		{url.Values{"kind": {"decode"}}, []string{"bad-1", "bad-2"}},
		{url.Values{"fingerprint": {declined.Fingerprint}}, []string{"pay-1", "pay-2", "pay-3"}},
		{url.Values{"key": {"pay-2"}}, []string{"pay-2"}},
		{url.Values{"error": {"DECLINED"}}, []string{"pay-1", "pay-2", "pay-3"}},
		{url.Values{"until": {third}}, keys(all[:2])},
		{url.Values{"since": {third}}, keys(all[2:])},
		{url.Values{"status": {"resolved"}}, nil},
	} {
		if got := keys(records(tt.q)); !slices.Equal(got, tt.want) {
			t.Errorf("records?%s: %v, want %v", tt.q.Encode(), got, tt.want)
		}
	}

	// Cursor paging: 2 a page, every record once, then no next page.
	seen := map[int64]bool{}
	cursor, pages := "", 0
	for {
		var page struct {
			Records []rec  `json:"records"`
			Next    string `json:"next"`
		}
		get("/api/records?"+url.Values{"topic": {dlqTopic}, "limit": {"2"}, "cursor": {cursor}}.Encode(), &page)
		pages++
		for _, r := range page.Records {
			if seen[r.ID] {
				t.Errorf("record %d on two pages", r.ID)
			}
			seen[r.ID] = true
		}
		if page.Next == "" || pages > 5 {
			break
		}
		cursor = page.Next
	}
	if len(seen) != 5 || pages != 3 {
		t.Errorf("paged through %d records in %d pages, want 5 in 3", len(seen), pages)
	}

	// A status change shows in the status filter and the audit log.
	pay1 := records(url.Values{"key": {"pay-1"}})[0]
	if code, b := e.call(t, "POST", "/api/actions/resolve", operatorSecret, map[string]any{"ids": []int64{pay1.ID}, "reason": "refunded"}); code != http.StatusOK {
		t.Fatalf("resolve: %d %s", code, b)
	}
	if got := keys(records(url.Values{"status": {"resolved"}})); !slices.Equal(got, []string{"pay-1"}) {
		t.Errorf("records?status=resolved after resolving pay-1: %v", got)
	}
	if got := keys(records(url.Values{"status": {"unresolved"}, "kind": {"permanent"}})); !slices.Equal(got, []string{"pay-2", "pay-3"}) {
		t.Errorf("records?status=unresolved&kind=permanent: %v", got)
	}
	var audit struct {
		Entries []struct {
			Actor, Action, Reason string
			RecordIDs             []int64 `json:"record_ids"`
		} `json:"entries"`
	}
	get("/api/audit", &audit)
	if len(audit.Entries) != 1 || audit.Entries[0].Action != "resolve" || audit.Entries[0].Actor != "olga" || audit.Entries[0].Reason != "refunded" {
		t.Errorf("audit: %+v", audit.Entries)
	}

	// One record: headers, error, masked payload.
	var one struct {
		Error   string `json:"error"`
		Headers []struct {
			Key, Value string
		} `json:"headers"`
		Value struct {
			Text   string `json:"text"`
			Masked int    `json:"masked_values"`
		} `json:"value"`
	}
	code, b := e.call(t, "GET", fmt.Sprint("/api/records/", pay1.ID), viewerSecret, nil)
	if code != http.StatusOK || json.Unmarshal(b, &one) != nil {
		t.Fatalf("GET one record: %d %s", code, b)
	}
	hasKey := slices.ContainsFunc(one.Headers, func(h struct{ Key, Value string }) bool { return h.Key == "idempotency-key" && h.Value == "pay-1" })
	if one.Error != "card declined" || !hasKey || one.Value.Masked != 1 || bytes.Contains(b, []byte("4111111111111111")) {
		t.Errorf("one record: %+v\n%s", one, b)
	}

	var outbox struct {
		Rows []any `json:"rows"`
	}
	get("/api/outbox/failed", &outbox)
	if len(outbox.Rows) != 0 {
		t.Errorf("failed outbox rows: %v, want none", outbox.Rows)
	}
}
