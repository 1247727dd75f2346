package serde

import (
	"encoding"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unsafe"

	"github.com/hamba/avro/v2"
	"github.com/modern-go/reflect2"
)

// avroTagKey is the struct tag hamba/avro's DefaultConfig matches record
// fields by (its Config.TagKey is unset, which means "avro").
const avroTagKey = "avro"

var (
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	unionConverterType  = reflect.TypeFor[avro.UnionConverter]()
)

// avroRecordDecoder decodes an Avro record into a struct as hamba/avro's
// own record decoder does, field by field in the schema's order with
// hamba/avro's decoder of each field, except for the fields that are a
// nullable union read into a pointer, which it decodes itself: hamba/avro's
// decoder of those runs a deferred closure and looks up the reader
// configuration's type converters (a sync.Map) for every non-null value, a
// fifth of a 7-field record's decode (issue 30). That look-up always misses
// here: the reader's configuration is serde's own (avroBounded), and
// nothing registers a converter on it. newAvroRecordDecoder says when it
// stands in for hamba/avro's.
type avroRecordDecoder struct {
	fields []avroFieldDecoder
}

// avroFieldDecoder decodes one record field into the struct field at
// offset: with dec, hamba/avro's decoder of the field's schema into the
// field's type; or, when dec is nil, as a nullable union whose branch
// nullIdx is null and whose other branch elemDec decodes into a new or
// the existing elem the field points to.
type avroFieldDecoder struct {
	offset  uintptr
	name    string // the Go field's, which hamba/avro's errors name
	dec     avro.ValDecoder
	nullIdx int
	elem    reflect2.Type
	elemDec avro.ValDecoder
}

// newAvroRecordDecoder returns the decoder of schema into ptrType's
// element (a *T) that stands in for avro.DefaultConfig.DecoderOf, or nil
// when T is outside the narrow case in which it decodes exactly as
// hamba/avro does: schema is a record (as the writer wrote it, never a
// resolved one: a resolved record has fields to skip or default) and T a
// struct with no embedded field, no two exported fields hamba/avro would
// match by one name (avroStructFields), neither
// T nor *T an encoding.TextUnmarshaler or an avro.UnionConverter, and for
// each of the schema's fields exactly one exported field whose tag is the
// field's name and nothing else (hamba/avro also matches untagged fields
// by their Go name, tags with options, aliases and embedded structs: those
// are left to it). Each field is decoded with avro.DefaultConfig's
// decoder of it.
func newAvroRecordDecoder(schema avro.Schema, ptrType reflect2.Type) avro.ValDecoder {
	rec, ok := schema.(*avro.RecordSchema)
	if !ok {
		return nil
	}
	pt := ptrType.Type1()
	st := pt.Elem()
	if st.Kind() != reflect.Struct {
		return nil
	}
	for _, it := range []reflect.Type{textUnmarshalerType, unionConverterType} {
		if st.Implements(it) || pt.Implements(it) {
			return nil
		}
	}
	fields, ok := avroStructFields(st)
	if !ok {
		return nil
	}
	d := &avroRecordDecoder{fields: make([]avroFieldDecoder, 0, len(rec.Fields()))}
	for _, f := range rec.Fields() {
		sf, ok := fields[f.Name()]
		if !ok {
			return nil
		}
		fd := avroFieldDecoder{offset: sf.Offset, name: sf.Name}
		if u, ok := f.Type().(*avro.UnionSchema); ok && u.Nullable() &&
			sf.Type.Kind() == reflect.Pointer && !sf.Type.Implements(unionConverterType) {
			nullIdx, typeIdx := u.Indices()
			fd.nullIdx = nullIdx
			fd.elem = reflect2.Type2(sf.Type.Elem())
			fd.elemDec = avro.DefaultConfig.DecoderOf(u.Types()[typeIdx], reflect2.Type2(sf.Type))
		} else {
			fd.dec = avro.DefaultConfig.DecoderOf(f.Type(), reflect2.Type2(reflect.PointerTo(sf.Type)))
		}
		d.fields = append(d.fields, fd)
	}
	return d
}

// avroStructFields returns st's exported fields by the name hamba/avro
// matches them by, keeping only those whose avro tag is exactly that name;
// false when st has an embedded field or two exported fields have one name
// for hamba/avro (the same tag, or a tag and a Go name), where hamba/avro's
// own rules decide. Unexported fields do not count: hamba/avro ignores
// them.
func avroStructFields(st reflect.Type) (map[string]reflect.StructField, bool) {
	fields := make(map[string]reflect.StructField, st.NumField())
	names := make(map[string]bool, st.NumField())
	for i := range st.NumField() {
		sf := st.Field(i)
		if sf.Anonymous {
			return nil, false
		}
		if !sf.IsExported() {
			continue
		}
		tag, tagged := sf.Tag.Lookup(avroTagKey)
		name := sf.Name
		if tagged {
			name, _, _ = strings.Cut(tag, ",")
		}
		if names[name] {
			return nil, false
		}
		names[name] = true
		if tagged && tag == name {
			fields[name] = sf
		}
	}
	return fields, true
}

// Decode decodes a record from r into the struct ptr points to, stopping
// at the first field that fails. A failure other than the payload's end
// names the Go field and is hamba/avro's error word for word. At the
// payload's end (io.EOF) hamba/avro's record decoder reads on, nothing,
// into the later fields, some of which then report an error of their own
// (a fixed: "unexpected EOF"), while this one stops: the error stays the
// truncation that it is (avroReadErr).
func (d *avroRecordDecoder) Decode(ptr unsafe.Pointer, r *avro.Reader) {
	for i := range d.fields {
		f := &d.fields[i]
		p := unsafe.Add(ptr, f.offset)
		if f.dec != nil {
			f.dec.Decode(p, r)
		} else {
			f.decodeNullable(p, r)
		}
		if r.Error != nil {
			if !errors.Is(r.Error, io.EOF) {
				r.Error = fmt.Errorf("%s: %w", f.name, r.Error)
			}
			return
		}
	}
}

// decodeNullable decodes a nullable union into the pointer field p points
// to as hamba/avro's unionNullableDecoder does without type converters:
// the branch index as its getUnionSchema reads it (an index out of range
// is its error), nil for the null branch, else the value decoded into the
// elem the field points to, a new one when it is nil.
func (f *avroFieldDecoder) decodeNullable(p unsafe.Pointer, r *avro.Reader) {
	idx := int(r.ReadInt())
	if idx < 0 || idx > 1 {
		r.ReportError("decode union type", "unknown union type")
		return
	}
	if idx == f.nullIdx {
		*(*unsafe.Pointer)(p) = nil
		return
	}
	if elem := *(*unsafe.Pointer)(p); elem != nil {
		f.elemDec.Decode(elem, r)
		return
	}
	elem := f.elem.UnsafeNew()
	f.elemDec.Decode(elem, r)
	*(*unsafe.Pointer)(p) = elem
}
