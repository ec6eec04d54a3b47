// Only a place to run `go mod download` of the real charts' modules from (ingress-nginx,
// node-feature-discovery); nothing is built here. The e2e tests (tender_e2e::real_charts) package
// the charts from the module archives. Kyverno's chart comes from e2e/tools/kyverno's download.
module tender.dev/e2e/tools/real-charts

go 1.26.0
