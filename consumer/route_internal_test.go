package consumer

import (
	"context"
	"testing"

	"github.com/idemhq/idem/handler"
)

// BenchmarkRouteLookup: what a route lookup adds per message (goal: under
// 50 ns). "one handler" is Run without Config.Routes: no lookup at all;
// "by topic" three routes on three topics; "by ce_type" three routes of one
// topic told apart by CloudEvents' type header (Config.TypeHeader), the
// message taking the last; "by ce_type, 20 types" twenty routes on one
// topic; "by TypeOf" the three by a KeyFunc reading the same header.
func BenchmarkRouteLookup(b *testing.B) {
	h := handler.Func(func(context.Context, *handler.Message) error { return nil })
	msg := &handler.Message{Topic: "orders", Headers: []handler.Header{
		{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
		{Key: "idempotency-key", Value: []byte("k-1")},
		{Key: "ce_type", Value: []byte("com.example.order.shipped")},
	}}
	msg.Original.Topic = "orders"
	base := Config{Topics: []string{"orders", "refunds", "shipments"}, TypeHeader: "ce_type"}.withDefaults()
	byType := func(n int) []Route {
		var rs []Route
		for i := range n - 1 {
			rs = append(rs, Route{Name: "r" + string(rune('a'+i)), Topics: []string{"orders"}, Types: []string{"com.example.order.t" + string(rune('a'+i))}, Handler: h})
		}
		return append(rs, Route{Name: "shipped", Topics: []string{"orders"}, Types: []string{"com.example.order.shipped"}, Handler: h})
	}
	for _, c := range []struct {
		name   string
		routes []Route
		def    handler.Handler
	}{
		{"one handler", nil, h},
		{"by topic", []Route{{Name: "r", Topics: []string{"refunds"}, Handler: h}, {Name: "s", Topics: []string{"shipments"}, Handler: h},
			{Name: "o", Topics: []string{"orders"}, Handler: h}}, nil},
		{"by ce_type", byType(3), nil},
		{"by ce_type, 20 types", byType(20), nil},
		{"by TypeOf", byType(3), nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := base
			cfg.Routes = c.routes
			if c.name == "by TypeOf" {
				cfg.TypeHeader, cfg.TypeOf = "", HeaderKey("ce_type")
			}
			rules, err := cfg.recovery()
			if err != nil {
				b.Fatal(err)
			}
			t, err := newRouteTable(cfg, c.def, rules)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if rt, _, err := t.lookup(msg); rt == nil || err != nil {
					b.Fatal(rt, err)
				}
			}
		})
	}
}
