// Package deploytest checks the deployment files under deploy/: the Compose
// quickstart, the Kubernetes manifests and the Helm chart. It is a module
// of its own so that the Kubernetes and Helm packages it decodes and renders
// with stay out of the sluice library's import graph; `make test` runs it.
package deploytest
