// Only a place to run `go mod download` of Kyverno's module from; nothing is built here.
// The e2e tests (tender_e2e::kyverno) read Kyverno's real CRDs from the module archive.
module tender.dev/e2e/tools/kyverno

go 1.26.0
