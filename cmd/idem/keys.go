package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
)

// encryptionKeyEnv holds the key-encryption key itself when no key file is
// given; there is no flag for it, so it never shows in a process list.
const encryptionKeyEnv = "IDEM_ENCRYPTION_KEY"

// encryptionFlag adds --encryption-key-file to fs, stored in file.
func encryptionFlag(fs *pflag.FlagSet, file *string) {
	fs.StringVar(file, "encryption-key-file", "", "file holding the key-encryption key of payloads encrypted at rest (mode 600; idem keys generate writes one; else "+encryptionKeyEnv+")")
	envFlag(fs, "encryption-key-file", "IDEM_ENCRYPTION_KEY_FILE")
}

// kekText returns the KEK source: the file, else the environment's key.
func (a *app) kekText(file string) (string, string) {
	if file != "" {
		return file, ""
	}
	return "", a.env(encryptionKeyEnv)
}

// keks returns the key-encryption keys of file, else of
// IDEM_ENCRYPTION_KEY; nil when neither is given.
func (a *app) keks(file string) ([]seal.KEK, error) {
	ks, err := seal.LoadKEKs(a.kekText(file))
	if err != nil {
		return nil, fmt.Errorf("encryption key: %w", err)
	}
	return ks, nil
}

// indexSealer returns the failure index's sealer for --encryption-key-file
// (or IDEM_ENCRYPTION_KEY), nil without one.
func (a *app) indexSealer(ctx context.Context, pool *pgxpool.Pool) (*seal.Sealer, error) {
	return a.sealer(ctx, pool, failidx.Purpose)
}

// sealer returns the sealer of purpose for --encryption-key-file (or
// IDEM_ENCRYPTION_KEY), nil without one.
func (a *app) sealer(ctx context.Context, pool *pgxpool.Pool, purpose string) (*seal.Sealer, error) {
	ks, err := a.keks(a.keyFile)
	if err != nil || ks == nil {
		return nil, err
	}
	return seal.New(ctx, seal.Config{DB: pool, KEKs: ks, Purpose: purpose})
}

func newKeysCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "keys <command>",
		Short: "Manage the keys of payloads encrypted at rest: generate, list, rotate, roll, destroy",
		Long: `Manage the keys of payload encryption at rest.

With a key-encryption key (KEK: --encryption-key-file of idem console, or
index.Indexer.EncryptionKeyFile), the failure index seals each record's value
and headers with AES-256-GCM under a data key, and keeps the data keys in
idem_seal_keys wrapped by the KEK. The KEK itself is never stored: it stays
in its file (mode 600) or in IDEM_ENCRYPTION_KEY.

  generate  write a new KEK to a file (never to the terminal)
  list      the data keys: purpose, KEK id, state, and the rows each seals
  rotate    re-wrap every data key under a new KEK (rows are not touched)
  roll      start a new data key now (writers seal under it from then on)
  destroy   forget a data key: every row it sealed is unreadable for good

Every change is written to the failure index's audit log under --actor.`,
		Example: `  idem keys generate --out /etc/idem/kek
  idem keys list --database-url postgres://idem@db/idem
  idem keys rotate --encryption-key-file /etc/idem/kek --new-key-file /etc/idem/kek.new
  idem keys destroy --id 7 --reason "erasure request 1234" --yes`,
	}
	c.PersistentFlags().StringVar(&a.actor, "actor", "", "name recorded in the audit log (default $USER)")
	envFlag(c.PersistentFlags(), "actor", "IDEM_ACTOR")
	c.AddCommand(newKeysGenerateCmd(a), newKeysListCmd(a), newKeysRotateCmd(a), newKeysRollCmd(a), newKeysDestroyCmd(a))
	return c
}

func newKeysGenerateCmd(a *app) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "generate",
		Short: "Write a new random key-encryption key to a new file (mode 600)",
		Long: `Write a new random key-encryption key (32 bytes, base64) to --out, a file
that must not exist yet, readable by its owner only. The key is never
printed; its KEK id (an HMAC of it, safe to log) is.`,
		Example: `  idem keys generate --out /etc/idem/kek`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("--out is required: the file to write the key to (the key is never printed)")
			}
			text, id, err := seal.GenerateKEK()
			if err != nil {
				return err
			}
			f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			if _, err := f.WriteString(text + "\n"); err != nil {
				_ = f.Close()
				return fmt.Errorf("--out: %w", err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			fmt.Fprintf(a.out, "wrote a new key-encryption key to %s (mode 600), KEK id %s\n", out, id)
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "file to create (it must not exist)")
	return c
}

// keysDB opens the database of a keys command, which must hold
// idem_seal_keys.
func keysDB(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pool, err := openPool(ctx, url)
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idem_seal_keys') IS NOT NULL`).Scan(&exists); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	if !exists {
		pool.Close()
		return nil, errors.New("this database has no idem_seal_keys: run `idem migrate` (nothing is encrypted here yet)")
	}
	return pool, nil
}

// sealedTables are the tables whose rows may be sealed at rest, each with
// a key_id column: the failure index (records and edited versions), parked
// ordering rows, deferred messages and the default outbox table.
var sealedTables = []string{"idem_dlq_records", "idem_dlq_versions", "idem_ordering_parked", "idem_deferred", "idem_outbox"}

// sealedRowsByKey counts the rows sealed under each data key in the
// sealedTables that exist (an outbox table of another name is not counted).
func sealedRowsByKey(ctx context.Context, pool *pgxpool.Pool) (map[int64]int64, error) {
	out := map[int64]int64{}
	var parts []string
	for _, t := range sealedTables {
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
			WHERE attrelid = to_regclass($1) AND attname = 'key_id' AND NOT attisdropped)`, t).Scan(&exists); err != nil {
			return nil, err
		}
		if exists {
			parts = append(parts, "SELECT key_id FROM "+t+" WHERE key_id IS NOT NULL")
		}
	}
	if len(parts) == 0 {
		return out, nil
	}
	rows, err := pool.Query(ctx, `SELECT key_id, count(*) FROM (`+strings.Join(parts, " UNION ALL ")+`) k GROUP BY key_id`)
	if err != nil {
		return nil, fmt.Errorf("count sealed rows by key: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, n int64
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

// auditKeys writes a key action to the failure index's audit log, when the
// database holds one.
func (a *app) auditKeys(ctx context.Context, pool *pgxpool.Pool, action, detail, reason, result string) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idem_dlq_audit') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return err
	}
	return failidx.NewStore(pool).WriteAudit(ctx, failidx.AuditEntry{Actor: a.actorName(), Action: action, Detail: detail, Reason: reason, Result: result})
}

func newKeysListCmd(a *app) *cobra.Command {
	var url string
	var asJSON bool
	c := &cobra.Command{
		Use:     "list",
		Short:   "List the data keys: purpose, KEK id, state, and the rows each seals",
		Example: `  idem keys list --database-url postgres://idem@db/idem --json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := keysDB(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			keys, err := seal.Keys(ctx, pool)
			if err != nil {
				return err
			}
			counts, err := sealedRowsByKey(ctx, pool)
			if err != nil {
				return err
			}
			if asJSON {
				type key struct {
					seal.KeyInfo
					Rows int64 `json:"rows"` // rows sealed under it, in every table that seals
				}
				out := []key{}
				for _, k := range keys {
					out = append(out, key{k, counts[k.ID]})
				}
				return writeJSON(a.out, out)
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPURPOSE\tSTATE\tKEK ID\tCREATED\tREWRAPPED\tROWS")
			for _, k := range keys {
				state := "live"
				if !k.DestroyedAt.IsZero() {
					state = fmt.Sprintf("destroyed %s by %s", fmtTime(k.DestroyedAt), text(k.DestroyedBy))
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\n", k.ID, text(k.Purpose), state, orDash(k.KEKID), fmtTime(k.CreatedAt), fmtTime(k.RewrappedAt), counts[k.ID])
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%d data keys\n", len(keys))
			return nil
		},
	}
	dbFlag(c, &url)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newKeysRotateCmd(a *app) *cobra.Command {
	var url, newFile string
	c := &cobra.Command{
		Use:   "rotate",
		Short: "Re-wrap every data key under a new key-encryption key",
		Long: `Re-wrap every data key under the first key of --new-key-file, in one
transaction, unwrapping each with --encryption-key-file (or
IDEM_ENCRYPTION_KEY) or the new file. No sealed row is read or rewritten.
When a data key is wrapped by none of the keys given, nothing changes.

Then restart every process that holds the old key (idem console, indexers)
with the new one, and retire the old key: copies of the wrapped data keys
in backups and WAL are useless without it.`,
		Example: `  idem keys rotate --database-url postgres://idem@db/idem --encryption-key-file /etc/idem/kek --new-key-file /etc/idem/kek.new`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if newFile == "" {
				return errors.New("--new-key-file is required (idem keys generate --out FILE writes one)")
			}
			to, err := seal.LoadKEKFile(newFile)
			if err != nil {
				return fmt.Errorf("--new-key-file: %w", err)
			}
			from, err := a.keks(a.keyFile)
			if err != nil {
				return err
			}
			pool, err := keysDB(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := seal.Rotate(ctx, pool, append(from, to[1:]...), to[0])
			detail := fmt.Sprintf("to KEK id %s", to[0].ID())
			if err != nil {
				return errors.Join(err, a.auditKeys(ctx, pool, "key-rotate", detail, "", "error: "+err.Error()))
			}
			result := fmt.Sprintf("ok: %d data keys re-wrapped, %d were already", res.Rewrapped, res.Already)
			if err := a.auditKeys(ctx, pool, "key-rotate", detail, "", result); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "re-wrapped %d data keys under KEK id %s (%d were already)\n", res.Rewrapped, to[0].ID(), res.Already)
			fmt.Fprintln(a.out, "next: restart idem console and every indexer with the new key file, then retire the old key")
			return nil
		},
	}
	dbFlag(c, &url)
	encryptionFlag(c.Flags(), &a.keyFile)
	c.Flags().StringVar(&newFile, "new-key-file", "", "file holding the new key-encryption key (its first key wraps)")
	return c
}

func newKeysRollCmd(a *app) *cobra.Command {
	var url, purpose string
	c := &cobra.Command{
		Use:   "roll",
		Short: "Start a new data key now: writers seal under it from their next batch",
		Long: `Start a new data key for --purpose, wrapped by the key-encryption key of
--encryption-key-file (or IDEM_ENCRYPTION_KEY). Writers use the newest key,
so rows from now on are sealed under it. Roll before destroying the key
writers use. (Writers also start a new key by themselves every 30 days.)`,
		Example: `  idem keys roll --database-url postgres://idem@db/idem --encryption-key-file /etc/idem/kek`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			ks, err := a.keks(a.keyFile)
			if err != nil {
				return err
			}
			if ks == nil {
				return fmt.Errorf("no key-encryption key: give --encryption-key-file or %s", encryptionKeyEnv)
			}
			pool, err := keysDB(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			// The key given must be the one the purpose's keys are wrapped by.
			if _, err := seal.New(ctx, seal.Config{DB: pool, KEKs: ks, Purpose: purpose}); err != nil {
				return err
			}
			id, err := seal.Roll(ctx, pool, ks[0], purpose)
			if err != nil {
				return err
			}
			if err := a.auditKeys(ctx, pool, "key-roll", fmt.Sprintf("data key %d for %s under KEK id %s", id, purpose, ks[0].ID()), "", "ok"); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "data key %d now seals new %s rows\n", id, purpose)
			return nil
		},
	}
	dbFlag(c, &url)
	encryptionFlag(c.Flags(), &a.keyFile)
	c.Flags().StringVar(&purpose, "purpose", failidx.Purpose, "what the key seals: "+failidx.Purpose+" (the failure index), "+
		keyorder.Purpose+" (parked messages), "+tables.DeferredPurpose+" (deferred messages) or "+outboxstore.Purpose+" (outbox rows)")
	return c
}

func newKeysDestroyCmd(a *app) *cobra.Command {
	var url, reason string
	var id int64
	var yes bool
	c := &cobra.Command{
		Use:   "destroy",
		Short: "Destroy a data key: every row it sealed becomes unreadable, for good",
		Long: `Destroy data key --id (crypto-shredding): its wrapped bytes are cleared, and
every value and header sealed under it can never be read again; the console
shows those records as "key destroyed" and never replays them. The rest of
each row (error text, keys, status) stays. Who, when and why are kept with
the key and in the audit log.

Older copies of the wrapped key live on in PostgreSQL's WAL and backups:
rotate to a new key-encryption key and retire the old one to make them
useless. There is no undo: --yes is required.`,
		Example: `  idem keys destroy --database-url postgres://idem@db/idem --id 7 --reason "erasure request 1234" --yes`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			switch {
			case id <= 0:
				return errors.New("--id is required: the data key to destroy (see idem keys list)")
			case strings.TrimSpace(reason) == "":
				return errors.New("--reason is required: why the key is destroyed (kept with the key and in the audit log)")
			}
			pool, err := keysDB(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			counts, err := sealedRowsByKey(ctx, pool)
			if err != nil {
				return err
			}
			if !yes {
				return fmt.Errorf("destroying data key %d makes the %d rows it sealed unreadable for good: add --yes", id, counts[id])
			}
			detail := fmt.Sprintf("data key %d (%d rows)", id, counts[id])
			if err := seal.Destroy(ctx, pool, id, a.actorName(), reason); err != nil {
				return errors.Join(err, a.auditKeys(ctx, pool, "key-destroy", detail, reason, "error: "+err.Error()))
			}
			if err := a.auditKeys(ctx, pool, "key-destroy", detail, reason, "ok: destroyed at "+time.Now().UTC().Format(time.RFC3339)); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "destroyed data key %d: %d rows of the failure index can no longer be read\n", id, counts[id])
			return nil
		},
	}
	dbFlag(c, &url)
	c.Flags().Int64Var(&id, "id", 0, "the data key to destroy (see idem keys list)")
	c.Flags().StringVar(&reason, "reason", "", "why (required; kept with the key and in the audit log)")
	c.Flags().BoolVar(&yes, "yes", false, "confirm: the rows sealed under the key are unreadable for good")
	return c
}
