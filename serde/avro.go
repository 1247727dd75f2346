package serde

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"reflect"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/hamba/avro/v2"
	"github.com/modern-go/reflect2"
)

// Avro returns a Codec for Avro records decoded into T with
// github.com/hamba/avro/v2: T is a struct whose fields carry `avro:"name"`
// tags (or a map[string]any, or any type hamba/avro maps the schema to).
// With Options.Schema, each writer's schema is resolved into it once per
// writer id (schema evolution: a reader with a newer compatible schema reads
// old records); a writer's schema it cannot resolve is a decode error. It
// returns an error when Options.Schema does not parse.
//
// A decode allocates in proportion to the record: an array of more items
// than the payload has bytes, or a string or bytes longer than it, is a
// decode error before anything is allocated for it (a poison record's
// block count of 2^40 items crashed the process). So Decode reads with
// hamba/avro configurations of its own (decoders are still
// avro.DefaultConfig's, with the types avro.Register named), and type
// converters registered with avro.RegisterTypeConverters do not apply.
// A record read as it was written into a struct whose fields match it by
// their avro tags alone is decoded field by field with hamba/avro's
// decoders, its nullable unions into pointers by idem (avroRecordDecoder: a
// fifth of hamba/avro's record decode).
func Avro[T any](reg *Registry, opts Options) (*Codec[T], error) {
	var reader avro.Schema
	if opts.Schema != "" {
		var err error
		if reader, err = avro.ParseWithCache(opts.Schema, "", &avro.SchemaCache{}); err != nil {
			return nil, fmt.Errorf("%w: Options.Schema is not an Avro schema: %w", errInvalidConfig, err)
		}
	}
	// The decoder of each writer's schema (resolved into the reader's),
	// made once per writer id; last is the one used last, the hot path's
	// (a topic's records mostly share one writer schema): looking a decoder
	// up in hamba/avro's caches (Reader.ReadVal) and the writer's id in a
	// sync.Map took 15 % of a 7-field record's decode.
	var decoders sync.Map // writer id → *avroDecoder
	var last atomic.Pointer[avroDecoder]
	ptrType := reflect2.TypeOf((*T)(nil))
	c := &Codec[T]{reg: reg, opts: opts, format: typeAvro}
	c.decode = func(s *Schema, body []byte, v *T, aux *any) error {
		d := last.Load()
		if d == nil || d.id != s.ID {
			got, ok := decoders.Load(s.ID)
			if !ok {
				got, _ = decoders.LoadOrStore(s.ID, newAvroDecoder(s, reader, ptrType))
			}
			d = got.(*avroDecoder)
			last.Store(d)
		}
		if d.err != nil {
			return d.err
		}
		r, _ := (*aux).(*avro.Reader) // the scratch's own reader: no second pool
		if r == nil {
			r = avro.NewReader(nil, 0)
			*aux = r
		}
		return avroDecode(d.dec, r, body, unsafe.Pointer(v))
	}
	c.encode = func(s *Schema, v T) ([]byte, error) {
		w, err := s.avro()
		if err != nil {
			return nil, err
		}
		b, err := avro.Marshal(w, v)
		if err != nil {
			return nil, err
		}
		return append(appendHeader(make([]byte, 0, 5+len(b)), s.ID, nil), b...), nil
	}
	return c, nil
}

// readers are hamba/avro readers, reused across decodes.
var readers = sync.Pool{New: func() any { return avro.NewReader(nil, 0) }}

// avroUnmarshal decodes body into v with schema. Unlike avro.Unmarshal it
// fails on a payload that ends inside a value: avro.Unmarshal takes io.EOF
// for success, so a record cut inside its last number decoded as 0
// (TestPoisonRecords/truncated_Avro_payload).
// v must be a non-nil pointer. Its decoder is avro.DefaultConfig's, its
// reader bounded by body's size (avroBounded).
func avroUnmarshal(schema avro.Schema, body []byte, v any) error {
	typ := reflect2.TypeOf(v)
	if typ == nil || typ.Kind() != reflect.Pointer || reflect2.IsNil(v) {
		return fmt.Errorf("serde: avroUnmarshal needs a non-nil pointer, not %T", v)
	}
	dec := avro.DefaultConfig.DecoderOf(schema, typ)
	r := readers.Get().(*avro.Reader)
	defer readers.Put(r)
	return avroDecode(dec, r, body, reflect2.PtrOf(v))
}

// avroBounds holds avroBounded's configurations, by the bit length of
// their bound, each made on first use.
var avroBounds [bits.UintSize + 1]atomic.Pointer[avro.API]

// avroBounded returns the hamba/avro configuration a payload of n bytes is
// read with (Reader.cfg: avroDecode): avro.DefaultConfig's settings, with
// arrays of at most b items and strings and bytes of at most b bytes, b
// the power of two above n (at least 4,096). An array in n bytes holds at
// most n items of any type that takes a byte (all but null and an empty
// record), and a string at most n bytes. Unbounded, hamba/avro makes an
// array's whole slice from its block count before it reads an item: a
// poison record of 20 bytes whose array claims 2^40 items ran the process
// out of memory (fatal, not an error), and one claiming 2^28 allocated
// 4 GiB (TestAvroArrayCountIsBoundedByThePayload).
func avroBounded(n int) avro.API {
	k := max(bits.Len(uint(n)), 12)
	if api := avroBounds[k].Load(); api != nil {
		return *api
	}
	api := avro.Config{MaxByteSliceSize: 1 << k, MaxSliceAllocSize: 1 << k}.Freeze()
	avroBounds[k].CompareAndSwap(nil, &api)
	return *avroBounds[k].Load()
}

// avroReadErr is a decode's error: a payload that ends inside a value is
// truncated (hamba/avro reports io.EOF).
func avroReadErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF):
		return fmt.Errorf("the Avro payload does not decode: it ends inside a value (truncated): %w", err)
	}
	return fmt.Errorf("the Avro payload does not decode: %w", err)
}

// avroResolved is a writer's schema resolved into the reader's, or why it
// cannot be.
type avroResolved struct {
	schema avro.Schema
	err    error
}

// avroDecoder is the hamba/avro decoder of one writer's schema into a
// codec's T (resolved into the codec's reader schema, when it has one), or
// why there is none.
type avroDecoder struct {
	id  int
	dec avro.ValDecoder
	err error
}

// newAvroDecoder makes the decoder of s into ptrType's element, s resolved
// into reader when reader is not nil: hamba/avro's, or, for a record read
// as it was written into a struct that matches it by tags alone,
// avroRecordDecoder.
func newAvroDecoder(s *Schema, reader avro.Schema, ptrType reflect2.Type) *avroDecoder {
	d := &avroDecoder{id: s.ID}
	w, err := s.avro()
	if err != nil {
		d.err = err
		return d
	}
	use := w
	if reader != nil {
		r := resolve(reader, w)
		if r.err != nil {
			d.err = r.err
			return d
		}
		use = r.schema
	}
	if use == w { // as written: a record decoder of ours may stand in for hamba/avro's
		d.dec = newAvroRecordDecoder(w, ptrType)
	}
	if d.dec == nil {
		d.dec = avro.DefaultConfig.DecoderOf(use, ptrType)
	}
	return d
}

// avroDecode decodes body into the value ptr points to with dec and the
// reader r, bounded by body's size (avroBounded), failing on a payload that
// ends inside a value; r keeps no record's bytes after.
func avroDecode(dec avro.ValDecoder, r *avro.Reader, body []byte, ptr unsafe.Pointer) error {
	avro.WithReaderConfig(avroBounded(len(body)))(r)
	r.Reset(body)
	r.Error = nil
	dec.Decode(ptr, r)
	err := r.Error
	r.Reset(nil)
	return avroReadErr(err)
}

// resolve resolves writer into reader. A writer's schema that is the
// reader's (the same canonical form) needs no resolution: decoding with a
// resolved schema goes through hamba/avro's type converters, about a third
// slower.
func resolve(reader, writer avro.Schema) avroResolved {
	if reader.Fingerprint() == writer.Fingerprint() {
		return avroResolved{schema: writer}
	}
	sch, err := avro.NewSchemaCompatibility().Resolve(reader, writer)
	if err != nil {
		err = fmt.Errorf("the reader's schema cannot read the writer's: %w", err)
	}
	return avroResolved{schema: sch, err: err}
}

// avro returns s parsed as an Avro schema, with the schemas it references
// (named types) parsed first into the same cache: its own, not hamba's
// global one, so two versions of one record name never meet.
func (s *Schema) avro() (avro.Schema, error) {
	s.once.Do(func() {
		if s.Type != typeAvro {
			s.err = fmt.Errorf("schema id %d is %s, not AVRO", s.ID, s.Type)
			return
		}
		cache := &avro.SchemaCache{}
		for _, r := range s.refs {
			if _, err := avro.ParseWithCache(r.text, "", cache); err != nil {
				s.err = fmt.Errorf("the referenced schema %q does not parse: %w", r.name, err)
				return
			}
		}
		sch, err := avro.ParseWithCache(s.Text, "", cache)
		if err != nil {
			s.err = fmt.Errorf("the writer's schema does not parse: %w", err)
			return
		}
		s.parsed = sch
	})
	if s.err != nil {
		return nil, s.err
	}
	return s.parsed.(avro.Schema), nil
}
