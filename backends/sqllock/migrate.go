package sqllock

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/warden-go/warden/guard/driver"
)

// Migrate creates or updates the lock table and the fence table with gorm's
// AutoMigrate. It is safe to run from several processes at once. On tables
// that are up to date it only reads, so that a role that may read and
// write their rows, and not alter them, can run it at every start.
//
// On MySQL and MariaDB it also converts the key columns (the lock table's
// name, the fence table's resource) of tables created by earlier versions
// from VARCHAR to VARBINARY, so that keys differing only in trailing spaces
// or letter case are distinct locks and distinct resources (see the package
// documentation, Tables). The conversion rewrites the table once, holding
// its metadata lock meanwhile: run it when the lock traffic is low.
func (l *Locker) Migrate(ctx context.Context) error {
	if err := migrate(ctx, l.db, l.d, l.rawTable, &lockRow{}); err != nil {
		return err
	}
	if err := migrate(ctx, l.db, l.d, l.fenceTable, &fenceRow{}); err != nil {
		return err
	}
	if err := binaryKeys(ctx, l.db, l.d, l.rawTable, "name"); err != nil {
		return err
	}
	if err := binaryKeys(ctx, l.db, l.d, l.fenceTable, "resource"); err != nil {
		return err
	}
	return roomForUpdates(ctx, l.db, l.d, l.rawTable)
}

// lockFillfactor is the share of each page of the lock table PostgreSQL
// fills with rows, leaving the rest for their updates.
const lockFillfactor = 50

// roomForUpdates has PostgreSQL leave half of each page of table free. Every
// acquisition, renewal and release rewrites its lock's row, and PostgreSQL
// writes the new version beside the old one, without touching the primary
// key's index (a HOT update), only when the page has room for it; in pages
// packed full, each of those statements also inserts an index entry, which
// costs more than the rest of the update, bloats the index, and leaves more
// for VACUUM. A renewal of 50,000 rows took 260-340ms with free room against
// 600-950ms without on the machine this was measured on. The setting only
// takes a lock that lets reads and writes go on, and governs the pages
// written from then on: rows move into such pages as they are updated.
//
// The setting is read first (pg_class.reloptions, which every role may
// read), and set only when it differs: ALTER TABLE needs the table's
// owner, and a read-only transaction refuses it, so that setting it at
// every start kept a service whose role may only read and write the rows
// (the owner being another, which made the table) from starting, and made
// each start wait for a VACUUM of the table, whose lock its lock conflicts
// with. The setting is compared as the number PostgreSQL reads from it
// (pgInteger): the text is stored as it was written ('50.0'), and none at
// all (RESET) is PostgreSQL's default, 100. A role that may not set it
// (not the owner, or on a read-only connection) is refused for good, told
// what to do, rather than told that the database is unavailable.
func roomForUpdates(ctx context.Context, db *gorm.DB, d dialect, table string) error {
	if d.name != "postgres" {
		return nil
	}
	quoted, err := quoteTable(db, table)
	if err != nil {
		return err
	}
	tx := db.WithContext(ctx)
	var values []string
	err = tx.Raw("SELECT option_value FROM pg_class, pg_options_to_table(reloptions)"+
		" WHERE oid = to_regclass(?) AND option_name = 'fillfactor'", quoted).Scan(&values).Error
	if err != nil {
		return unavailable(ctx, fmt.Errorf("migrate %s: reading its fillfactor: %w", table, err))
	}
	if len(values) == 1 && pgInteger(values[0]) == lockFillfactor {
		return nil
	}
	alter := fmt.Sprintf("ALTER TABLE %s SET (fillfactor = %d)", quoted, lockFillfactor)
	if err := tx.Exec(alter).Error; err != nil {
		switch sqlState(err) {
		case "42501", "25006": // insufficient_privilege, read_only_sql_transaction
			return fmt.Errorf("%w: migrate %s: its fillfactor is not %d, and only the table's owner, on a writable connection, may set it:"+
				" run Migrate once as the owner, or have the owner run %s: %w", driver.ErrInvalidOption, table, lockFillfactor, alter, err)
		}
		return unavailable(ctx, fmt.Errorf("migrate %s: %s: %w", table, alter, err))
	}
	return nil
}

// pgInteger is the value PostgreSQL reads from text it accepted for an
// integer option, as it was stored: in decimal, octal with a leading 0, or
// hexadecimal with 0x ("050" is 40), or with a fraction or an exponent,
// rounded to the nearest, halves to even. It is -1 for text it would not
// have accepted.
func pgInteger(s string) int64 {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "_") {
		return -1 // Go reads digits separated by _, PostgreSQL does not
	}
	if n, err := strconv.ParseInt(s, 0, 64); err == nil {
		return n
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return -1
	}
	return int64(math.RoundToEven(f))
}

// lockRow is the lock table's schema, for AutoMigrate.
type lockRow struct {
	Name      keyColumn `gorm:"column:name;primaryKey;not null"`
	Owner     string    `gorm:"column:owner;type:varchar(255);not null"`
	Version   int64     `gorm:"column:version;not null"`
	LockUntil int64     `gorm:"column:lock_until;not null"`
	LockedAt  int64     `gorm:"column:locked_at;not null"`
	// WaitingUntil is until when a waiter that listens for releases is
	// known to wait, on the same clock as LockUntil. Only PostgreSQL's
	// statements read and write it; the column is on every database so
	// that the schema is one.
	WaitingUntil int64 `gorm:"column:waiting_until;not null;default:0"`
}

// fenceRow is the fence table's schema, for AutoMigrate.
type fenceRow struct {
	Resource keyColumn `gorm:"column:resource;primaryKey;not null"`
	Token    int64     `gorm:"column:token;not null"`
}

// keyColumn is the type of the columns keys are looked up by. They must
// compare byte for byte, as Go strings do: on MySQL and MariaDB every text
// collation either ignores trailing spaces (PAD SPACE, utf8mb4_bin among
// them) or letter case, or both, which would make "k" and "k " one lock, so
// they are VARBINARY there.
type keyColumn string

// GormDBDataType tells AutoMigrate the column's type on db.
func (keyColumn) GormDBDataType(db *gorm.DB, _ *schema.Field) string {
	if db.Dialector.Name() == "mysql" {
		return fmt.Sprintf("varbinary(%d)", maxName)
	}
	return fmt.Sprintf("varchar(%d)", maxName)
}

// binaryKeys makes column of table a VARBINARY on MySQL, where the table was
// created with a VARCHAR key column. AutoMigrate never changes the type of a
// primary key column, hence this. Other databases compare text byte for byte
// already.
func binaryKeys(ctx context.Context, db *gorm.DB, d dialect, table, column string) error {
	if d.name != "mysql" {
		return nil
	}
	tx := db.WithContext(ctx)
	schemaName, name := tableSchema(table)
	var types []string
	err := tx.Raw("SELECT DATA_TYPE FROM information_schema.COLUMNS"+
		" WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME = ?",
		schemaName, name, column).Scan(&types).Error
	if err != nil {
		return unavailable(ctx, fmt.Errorf("migrate %s: reading the type of %s: %w", table, column, err))
	}
	if len(types) == 1 && strings.EqualFold(types[0], "varbinary") {
		return nil
	}
	quoted, err := quoteTable(db, table)
	if err != nil {
		return err
	}
	var col strings.Builder
	db.Dialector.QuoteTo(&col, column)
	alter := fmt.Sprintf("ALTER TABLE %s MODIFY %s VARBINARY(%d) NOT NULL", quoted, col.String(), maxName)
	if err := tx.Exec(alter).Error; err != nil {
		return unavailable(ctx, fmt.Errorf("migrate %s: %s (keys must compare byte for byte): %w", table, alter, err))
	}
	return nil
}

func migrate(ctx context.Context, db *gorm.DB, d dialect, table string, model any) error {
	if err := autocommits(ctx, db, d); err != nil {
		return err
	}
	// Before the table is made: a refused pool is left without one, which
	// an application that goes on despite the refusal would use.
	if err := oneDatabase(ctx, db, d, table); err != nil {
		return err
	}
	// Before the table is altered too, and again after: another process
	// may have made it meanwhile, or the server put another engine in
	// InnoDB's place.
	if err := transactional(ctx, db, d, table); err != nil {
		return err
	}
	run := func() error {
		tx := db.WithContext(ctx)
		if d.name == "mysql" {
			// InnoDB whatever the server's default engine: see
			// transactional. Text compares case-sensitively, as on the
			// other databases; key columns are binary besides
			// (keyColumn).
			tx = tx.Set("gorm:table_options", "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin")
		}
		if qualifiedMySQL(d, table) {
			exists, err := hasTable(ctx, db, d, table)
			if err != nil {
				return err
			}
			if exists {
				return addColumns(ctx, tx, table, model)
			}
		}
		return tx.Table(table).AutoMigrate(model)
	}
	err := run()
	if err != nil && ctx.Err() == nil {
		if exists, _ := hasTable(ctx, db, d, table); exists {
			// Another process created the table between AutoMigrate's
			// check and its CREATE TABLE: run it again to apply the rest.
			err = run()
		}
	}
	if err != nil {
		return unavailable(ctx, fmt.Errorf("migrate %s: %w", table, err))
	}
	return transactional(ctx, db, d, table)
}

// transactional refuses a MySQL table whose engine has no transactions
// (MyISAM, Aria, MEMORY: one made by hand, or by an earlier version on a
// server whose default engine was one of those). A statement such an
// engine refuses midway, as a trigger may, keeps the rows it had already
// written, so that a release or a takeover could be half done, or done
// and reported refused; on a transactional engine each statement, run
// alone in autocommit, is done whole or not at all.
func transactional(ctx context.Context, db *gorm.DB, d dialect, table string) error {
	if d.name != "mysql" {
		return nil
	}
	schemaName, name := tableSchema(table)
	var engines []struct{ Engine, Transactions string }
	err := db.WithContext(ctx).Raw("SELECT t.ENGINE AS engine, COALESCE(e.TRANSACTIONS, 'NO') AS transactions"+
		" FROM information_schema.TABLES t LEFT JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE"+
		" WHERE t.TABLE_SCHEMA = COALESCE(?, DATABASE()) AND t.TABLE_NAME = ? AND t.ENGINE IS NOT NULL",
		schemaName, name).Scan(&engines).Error
	if err != nil {
		return unavailable(ctx, fmt.Errorf("reading the engine of %s: %w", table, err))
	}
	for _, e := range engines {
		if !strings.EqualFold(e.Transactions, "YES") {
			return fmt.Errorf("%w: table %s uses the %s engine, which has no transactions: a statement refused midway keeps what it wrote;"+
				" convert it (ALTER TABLE %s ENGINE=InnoDB) or drop it for Migrate to make anew", driver.ErrInvalidOption, table, e.Engine, table)
		}
	}
	return nil
}

// tableSchema splits table into the database it names, nil for the
// connection's own (for COALESCE(?, DATABASE())), and its name.
func tableSchema(table string) (any, string) {
	if s, t, ok := strings.Cut(table, "."); ok {
		return s, t
	}
	return nil, table
}

// qualifiedMySQL reports whether table names its database on MySQL
// ("db.table"). gorm's MySQL migrator looks such a table up in the
// connection's own database, missing it there, so that AutoMigrate tried to
// create it again when it existed, and failed.
func qualifiedMySQL(d dialect, table string) bool {
	return d.name == "mysql" && strings.Contains(table, ".")
}

// hasTable reports whether table exists, looking a MySQL table that names
// its database up in that database (see qualifiedMySQL).
func hasTable(ctx context.Context, db *gorm.DB, d dialect, table string) (bool, error) {
	tx := db.WithContext(ctx)
	if !qualifiedMySQL(d, table) {
		return tx.Migrator().HasTable(table), nil
	}
	schemaName, name, _ := strings.Cut(table, ".")
	var n int64
	err := tx.Raw("SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", schemaName, name).Scan(&n).Error
	return n > 0, err
}

// addColumns adds to table, a MySQL table that names its database (see
// qualifiedMySQL), the columns of model it lacks, as AutoMigrate does to a
// table of an earlier version (waiting_until). gorm's migrator looks the
// columns up in the connection's own database too, so they are read here.
func addColumns(ctx context.Context, db *gorm.DB, table string, model any) error {
	tx := db.WithContext(ctx).Table(table)
	stmt := &gorm.Statement{DB: tx}
	if err := stmt.Parse(model); err != nil {
		return err
	}
	schemaName, name, _ := strings.Cut(table, ".")
	var have []string
	err := tx.Raw("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", schemaName, name).Scan(&have).Error
	if err != nil {
		return err
	}
	for _, f := range stmt.Schema.Fields {
		if f.DBName == "" || slices.ContainsFunc(have, func(c string) bool { return strings.EqualFold(c, f.DBName) }) {
			continue
		}
		if err := tx.Migrator().AddColumn(model, f.Name); err != nil {
			return err
		}
	}
	return nil
}
