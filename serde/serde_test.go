package serde_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/serde"
	"github.com/idemhq/idem/serde/internal/testpb"
)

// OrderV1 and OrderV2 are two versions of an Avro record: V2 adds a field
// with a default, a backward-compatible change.
type OrderV1 struct {
	ID    string `avro:"id"`
	Cents int64  `avro:"cents"`
}

type OrderV2 struct {
	ID       string `avro:"id"`
	Cents    int64  `avro:"cents"`
	Currency string `avro:"currency"`
}

const (
	orderV1 = `{"type":"record","name":"Order","namespace":"idem.serdetest","fields":[
		{"name":"id","type":"string"},{"name":"cents","type":"long"}]}`
	orderV2 = `{"type":"record","name":"Order","namespace":"idem.serdetest","fields":[
		{"name":"id","type":"string"},{"name":"cents","type":"long"},
		{"name":"currency","type":"string","default":"EUR"}]}`
	// orderNoDefault adds a field without a default: it cannot read V1.
	orderNoDefault = `{"type":"record","name":"Order","namespace":"idem.serdetest","fields":[
		{"name":"id","type":"string"},{"name":"cents","type":"long"},
		{"name":"customer","type":"string"}]}`

	orderJSONSchema = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",
		"properties":{"id":{"type":"string","minLength":1},"cents":{"type":"integer","minimum":0}},
		"required":["id","cents"]}`
)

// ordersProto is the .proto file of package testpb, registered as it is.
var ordersProto = func() string {
	b, err := os.ReadFile("internal/testpb/orders.proto")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

type OrderJSON struct {
	ID    string `json:"id"`
	Cents int64  `json:"cents"`
}

func msg(v []byte) *handler.Message { return &handler.Message{Topic: "orders", Value: v} }

func TestAvroRoundTrip(t *testing.T) {
	url := registryURL(t)
	reg := newRegistry(t, url)
	ctx := ctxOf(t)
	subj := subject(t, url, "value")
	c, err := serde.Avro[OrderV1](reg, serde.Options{Subject: subj, Schema: orderV1})
	if err != nil {
		t.Fatal(err)
	}
	in := OrderV1{ID: "o-1", Cents: 1250}
	b, err := c.Encode(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != 0 || binary.BigEndian.Uint32(b[1:5]) == 0 {
		t.Fatalf("not in the wire format: % x", b[:5])
	}
	out, err := c.Decode(ctx, msg(b))
	if err != nil || out != in {
		t.Fatalf("Decode = %+v, %v; want %+v", out, err, in)
	}
	// Registering the same schema again, from another client, gives the same id.
	again, err := newRegistry(t, url).Register(ctx, subj, "AVRO", orderV1)
	if err != nil || again.ID != int(binary.BigEndian.Uint32(b[1:5])) {
		t.Fatalf("registered again: %+v, %v; want id %d", again, err, binary.BigEndian.Uint32(b[1:5]))
	}
	key, err := c.Key(func(o OrderV1) string { return o.ID })(msg(b))
	if err != nil || key != "o-1" {
		t.Fatalf("Key = %q, %v; want o-1", key, err)
	}
	js, s, err := reg.DecodeJSON(ctx, b)
	if err != nil || s.Type != "AVRO" || !strings.Contains(string(js), `"id":"o-1"`) {
		t.Fatalf("DecodeJSON = %s, %+v, %v", js, s, err)
	}
}

// A reader with a newer, compatible schema reads records written with the
// older one (the added field takes its default); a reader whose schema
// cannot resolve the writer's gets a decode error.
func TestAvroEvolution(t *testing.T) {
	url := registryURL(t)
	reg := newRegistry(t, url)
	ctx := ctxOf(t)
	subj := subject(t, url, "value")
	v1, err := serde.Avro[OrderV1](reg, serde.Options{Subject: subj, Schema: orderV1})
	if err != nil {
		t.Fatal(err)
	}
	old, err := v1.Encode(ctx, OrderV1{ID: "o-old", Cents: 7})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := serde.Avro[OrderV2](reg, serde.Options{Subject: subj, Schema: orderV2})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := v2.Encode(ctx, OrderV2{ID: "o-new", Cents: 8, Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	if binary.BigEndian.Uint32(old[1:5]) == binary.BigEndian.Uint32(fresh[1:5]) {
		t.Fatal("v1 and v2 have one schema id")
	}
	got, err := v2.Decode(ctx, msg(old))
	if want := (OrderV2{ID: "o-old", Cents: 7, Currency: "EUR"}); err != nil || got != want {
		t.Fatalf("v2 reading a v1 record = %+v, %v; want %+v", got, err, want)
	}
	got, err = v2.Decode(ctx, msg(fresh))
	if want := (OrderV2{ID: "o-new", Cents: 8, Currency: "USD"}); err != nil || got != want {
		t.Fatalf("v2 reading a v2 record = %+v, %v; want %+v", got, err, want)
	}
	// An old reader reads new records too (forward: the new field is skipped).
	if got, err := v1.Decode(ctx, msg(fresh)); err != nil || got != (OrderV1{ID: "o-new", Cents: 8}) {
		t.Fatalf("v1 reading a v2 record = %+v, %v", got, err)
	}
	strict, err := serde.Avro[OrderV2](reg, serde.Options{Schema: orderNoDefault})
	if err != nil {
		t.Fatal(err)
	}
	_, err = strict.Decode(ctx, msg(old))
	var de *serde.DecodeError
	if !handler.IsDecode(err) || !errors.As(err, &de) || de.SchemaID != int(binary.BigEndian.Uint32(old[1:5])) {
		t.Fatalf("a reader that cannot resolve the writer: %v; want a decode error naming the writer's id", err)
	}
	t.Logf("unresolvable: %v", err)
}

func TestProtobufRoundTrip(t *testing.T) {
	url := registryURL(t)
	reg := newRegistry(t, url)
	ctx := ctxOf(t)
	subj := subject(t, url, "value")
	orders, err := serde.Protobuf[*testpb.Order](reg, serde.Options{Subject: subj, Schema: ordersProto})
	if err != nil {
		t.Fatal(err)
	}
	in := &testpb.Order{Id: "o-1", Cents: 990, Currency: "EUR", Lines: []*testpb.Order_Line{{Sku: "a", Qty: 2}}}
	b, err := orders.Encode(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if b[5] != 0 { // the [0] shortcut: one 0 byte
		t.Fatalf("index of the first message: % x, want 00", b[5])
	}
	out, err := orders.Decode(ctx, msg(b))
	if err != nil || !proto.Equal(out, in) {
		t.Fatalf("Decode = %v, %v; want %v", out, err, in)
	}
	// The second message: index [1], written as count 1, index 1.
	refunds, err := serde.Protobuf[*testpb.Refund](reg, serde.Options{Subject: subj})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := refunds.Encode(ctx, &testpb.Refund{OrderId: "o-1", Cents: 100})
	if err != nil {
		t.Fatal(err)
	}
	if got := rb[5:7]; got[0] != 2 || got[1] != 2 { // zigzag 1 = 2
		t.Fatalf("index [1] encoded % x, want 02 02", got)
	}
	r, err := refunds.Decode(ctx, msg(rb))
	if err != nil || r.GetOrderId() != "o-1" {
		t.Fatalf("refund = %v, %v", r, err)
	}
	// An Order codec refuses a Refund: the record is not its message.
	if _, err := orders.Decode(ctx, msg(rb)); !handler.IsDecode(err) || !strings.Contains(err.Error(), "idem.serdetest.Refund") {
		t.Fatalf("Order codec on a Refund: %v", err)
	}
	js, _, err := reg.DecodeJSON(ctx, b)
	if err != nil || !strings.Contains(string(js), `"currency":"EUR"`) {
		t.Fatalf("DecodeJSON = %s, %v", js, err)
	}
}

func TestJSONSchemaRoundTrip(t *testing.T) {
	url := registryURL(t)
	reg := newRegistry(t, url)
	ctx := ctxOf(t)
	c, err := serde.JSONSchema[OrderJSON](reg, serde.Options{Subject: subject(t, url, "value"), Schema: orderJSONSchema})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Encode(ctx, OrderJSON{ID: "o-1", Cents: 5})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Decode(ctx, msg(b))
	if err != nil || got != (OrderJSON{ID: "o-1", Cents: 5}) {
		t.Fatalf("Decode = %+v, %v", got, err)
	}
	// Encode refuses what the schema rejects; a record that breaks it is a
	// decode error.
	if _, err := c.Encode(ctx, OrderJSON{ID: "", Cents: 5}); err == nil || !handler.IsPermanent(err) {
		t.Fatalf("Encode of an invalid document: %v", err)
	}
	bad := append(append([]byte(nil), b[:5]...), []byte(`{"id":"o-2","cents":-1}`)...)
	if _, err := c.Decode(ctx, msg(bad)); !handler.IsDecode(err) {
		t.Fatalf("Decode of an invalid document: %v", err)
	}
}

// EncodeJSON (idem produce) writes what the codecs read, for each format.
func TestEncodeJSON(t *testing.T) {
	url := registryURL(t)
	reg := newRegistry(t, url)
	ctx := ctxOf(t)
	avroSchema, err := reg.Register(ctx, subject(t, url, "avro"), "AVRO", orderV2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := reg.EncodeJSON(ctx, avroSchema, "", []byte(`{"id":"o-9","cents":42}`))
	if err != nil {
		t.Fatal(err)
	}
	v2, _ := serde.Avro[OrderV2](reg, serde.Options{})
	if got, err := v2.Decode(ctx, msg(b)); err != nil || got != (OrderV2{ID: "o-9", Cents: 42, Currency: "EUR"}) {
		t.Fatalf("Avro from JSON = %+v, %v", got, err)
	}
	if _, err := reg.EncodeJSON(ctx, avroSchema, "", []byte(`{"id":"o-9","cents":"many"}`)); err == nil || !strings.Contains(err.Error(), "cents") {
		t.Fatalf("a field that does not fit: %v", err)
	}

	protoSchema, err := reg.Register(ctx, subject(t, url, "proto"), "PROTOBUF", ordersProto)
	if err != nil {
		t.Fatal(err)
	}
	b, err = reg.EncodeJSON(ctx, protoSchema, "Refund", []byte(`{"orderId":"o-9","cents":"3"}`))
	if err != nil {
		t.Fatal(err)
	}
	refunds, _ := serde.Protobuf[*testpb.Refund](reg, serde.Options{})
	if got, err := refunds.Decode(ctx, msg(b)); err != nil || got.GetCents() != 3 {
		t.Fatalf("Protobuf from JSON = %v, %v", got, err)
	}

	jsonSchema, err := reg.Register(ctx, subject(t, url, "json"), "JSON", orderJSONSchema)
	if err != nil {
		t.Fatal(err)
	}
	b, err = reg.EncodeJSON(ctx, jsonSchema, "", []byte(`{ "id": "o-9", "cents": 1 }`))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b[5:], &doc); err != nil || doc["id"] != "o-9" {
		t.Fatalf("JSON Schema from JSON: %s, %v", b[5:], err)
	}
}

// RecordName and Subject name a record's type for consumer.Config.TypeOf:
// Avro's full name, the Protobuf message of the index path, a JSON
// Schema's title; the subject the registry lists for the id. A value not
// in the wire format is a decode error.
func TestRecordNameAndSubject(t *testing.T) {
	url := registryURL(t)
	reg := newRegistry(t, url)
	ctx := ctxOf(t)
	avroSubj, protoSubj, jsonSubj := subject(t, url, "avro"), subject(t, url, "proto"), subject(t, url, "json")
	avroC, err := serde.Avro[OrderV1](reg, serde.Options{Subject: avroSubj, Schema: orderV1})
	if err != nil {
		t.Fatal(err)
	}
	refunds, err := serde.Protobuf[*testpb.Refund](reg, serde.Options{Subject: protoSubj, Schema: ordersProto})
	if err != nil {
		t.Fatal(err)
	}
	// The JSON Schema's title is the test's own, so that its id is too: a
	// registry gives one schema one id whatever subject it is registered
	// under, and lists that id's first subject.
	titled := strings.Replace(orderJSONSchema, `"type":"object"`, `"title":"`+jsonSubj+`","type":"object"`, 1)
	jsonC, err := serde.JSONSchema[OrderJSON](reg, serde.Options{Subject: jsonSubj, Schema: titled})
	if err != nil {
		t.Fatal(err)
	}
	a, err := avroC.Encode(ctx, OrderV1{ID: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := refunds.Encode(ctx, &testpb.Refund{OrderId: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	j, err := jsonC.Encode(ctx, OrderJSON{ID: "o-1", Cents: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		value         []byte
		name, subject string
	}{{a, "idem.serdetest.Order", ""}, {p, "idem.serdetest.Refund", ""}, {j, jsonSubj, jsonSubj}} {
		if name, err := reg.RecordName(msg(c.value)); err != nil || name != c.name {
			t.Errorf("RecordName = %q, %v; want %q", name, err, c.name)
		}
		// The Avro and Protobuf schemas are shared with other tests: their
		// id's first subject may be another's.
		if subj, err := reg.Subject(msg(c.value)); err != nil || subj == "" || c.subject != "" && subj != c.subject {
			t.Errorf("Subject = %q, %v; want %q", subj, err, c.subject)
		}
	}
	if _, err := reg.RecordName(msg([]byte("{}"))); !handler.IsDecode(err) {
		t.Errorf("RecordName of a value not in the wire format: %v, want a decode error", err)
	}
}
