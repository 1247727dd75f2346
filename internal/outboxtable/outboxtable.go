// Package outboxtable parses and quotes the name of an outbox table, "table"
// or "schema.table", for package outbox and the CLI's internal/outboxadmin,
// so both read a name the same way.
package outboxtable

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Default is the outbox table used when no table is named (outbox.DefaultTable).
const Default = "idem_outbox"

// ErrInvalidConfig is outbox.ErrInvalidConfig. It is declared here so that
// internal/outboxadmin, which package outbox's own tests import, wraps the
// same sentinel without importing outbox.
var ErrInvalidConfig = errors.New("outbox: invalid configuration")

// Name is a parsed table name.
type Name struct {
	Schema string // "" when unqualified
	Rel    string // the table itself
	Quoted string // the SQL identifier, quoted ("schema"."table")
}

// Parse parses name, "table" or "schema.table" ("" for Default), each part
// non-empty, valid UTF-8 without NUL and at most 63 bytes (PostgreSQL's
// identifier length). Its errors wrap ErrInvalidConfig.
func Parse(name string) (Name, error) {
	if name == "" {
		name = Default
	}
	schema, rel, qualified := strings.Cut(name, ".")
	if !qualified {
		schema, rel = "", name
	}
	if rel == "" || (qualified && schema == "") {
		return Name{}, fmt.Errorf("%w: table name %q: want \"table\" or \"schema.table\" with non-empty parts", ErrInvalidConfig, name)
	}
	for _, p := range []string{schema, rel} {
		if len(p) > 63 || strings.ContainsRune(p, 0) || !utf8.ValidString(p) {
			return Name{}, fmt.Errorf("%w: table name %q: each part must be valid UTF-8, without NUL, at most 63 bytes", ErrInvalidConfig, name)
		}
	}
	return Name{Schema: schema, Rel: rel, Quoted: Qualify(schema, rel)}, nil
}

// Qualify quotes rel, in schema unless it is "".
func Qualify(schema, rel string) string {
	if schema == "" {
		return pgx.Identifier{rel}.Sanitize()
	}
	return pgx.Identifier{schema, rel}.Sanitize()
}
