// Command promql-check parses alerting-rule files as Prometheus does (`promtool check rules`:
// rulefmt, whose checks include every expression, label and annotation template) and files of
// PromQL expressions, one per line, with Prometheus's own parser. It prints every error and
// exits 1 if there was one.
//
// Usage: promql-check [-exprs FILE]... [RULES_FILE]...
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/prometheus/common/model"

	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	var exprFiles files
	flag.Var(&exprFiles, "exprs", "a file of PromQL expressions, one per line (repeatable)")
	flag.Parse()
	failed := false
	pql := parser.NewParser(parser.Options{})
	for _, path := range flag.Args() {
		_, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, pql, slog.Default())
		for _, err := range errs {
			fmt.Printf("%s: %v\n", path, err)
			failed = true
		}
	}
	for _, path := range exprFiles {
		f, err := os.Open(path)
		if err != nil {
			fmt.Printf("%s: %v\n", path, err)
			failed = true
			continue
		}
		scanner := bufio.NewScanner(f)
		scanner.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; scanner.Scan(); n++ {
			line := strings.TrimSpace(scanner.Text())
			if line == "" {
				continue
			}
			if _, err := pql.ParseExpr(line); err != nil {
				fmt.Printf("%s:%d: %v\n", path, n, err)
				failed = true
			}
		}
		f.Close()
	}
	if failed {
		os.Exit(1)
	}
}
