// promql-check parses PromQL expressions with Prometheus's own parser and reports the metric
// names and label names each one uses. Input (stdin): a JSON array of {"source", "expr"}.
// Output (stdout): a JSON array of {"source", "metrics": [{"name", "labels"}], "error"}.
// Grafana's interval variables are replaced by durations before parsing.
package main

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"

	"github.com/prometheus/prometheus/promql/parser"
)

type input struct {
	Source string `json:"source"`
	Expr   string `json:"expr"`
}

type metric struct {
	Name   string   `json:"name"`
	Labels []string `json:"labels"`
}

type output struct {
	Source  string   `json:"source"`
	Metrics []metric `json:"metrics"`
	Error   string   `json:"error,omitempty"`
}

var grafanaInterval = regexp.MustCompile(`\$(__rate_interval|__interval|__range)|\$\{(__rate_interval|__interval|__range)\}`)

func main() {
	p := parser.NewParser(parser.Options{})
	var in []input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		panic(err)
	}
	out := []output{}
	for _, e := range in {
		o := output{Source: e.Source, Metrics: []metric{}}
		expr, err := p.ParseExpr(grafanaInterval.ReplaceAllString(e.Expr, "5m"))
		if err != nil {
			o.Error = err.Error()
			out = append(out, o)
			continue
		}
		// Labels a selector matches on, and those its enclosing aggregations group by.
		var grouping []string
		parser.Inspect(expr, func(node parser.Node, path []parser.Node) error {
			switch n := node.(type) {
			case *parser.AggregateExpr:
				grouping = append(grouping, n.Grouping...)
			case *parser.VectorSelector:
				labels := map[string]bool{}
				for _, m := range n.LabelMatchers {
					if m.Name != "__name__" {
						labels[m.Name] = true
					}
				}
				for _, p := range path {
					if a, ok := p.(*parser.AggregateExpr); ok {
						for _, g := range a.Grouping {
							labels[g] = true
						}
					}
				}
				names := []string{}
				for l := range labels {
					names = append(names, l)
				}
				sort.Strings(names)
				o.Metrics = append(o.Metrics, metric{Name: n.Name, Labels: names})
			}
			return nil
		})
		out = append(out, o)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		panic(err)
	}
}
