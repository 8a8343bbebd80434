{{/*
Names. Kubernetes names are DNS labels (63 characters), so every name is
truncated there and stripped of a trailing dash.
*/}}
{{- define "torchfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "torchfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "torchfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "torchfleet.labels" -}}
helm.sh/chart: {{ include "torchfleet.chart" . }}
{{ include "torchfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: torchfleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The stable subset used in selectors (never add a changing label here). */}}
{{- define "torchfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "torchfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "torchfleet.operator.selectorLabels" -}}
{{ include "torchfleet.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "torchfleet.operator.labels" -}}
{{ include "torchfleet.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "torchfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "torchfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: a digest pins it; otherwise the tag, or appVersion. */}}
{{- define "torchfleet.operator.image" -}}
{{- $image := .Values.operator.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{- define "torchfleet.defaultTrainerImage" -}}
{{- default (printf "ghcr.io/torchfleet/trainer:%s" .Chart.AppVersion) .Values.operator.defaults.trainerImage }}
{{- end }}

{{/*
Namespaces the operator reconciles, de-duplicated; empty means all. The
release namespace is not added implicitly: the operator only needs its own
namespace if jobs are submitted there.
*/}}
{{- define "torchfleet.watchNamespaces" -}}
{{- .Values.operator.watchNamespaces | uniq | toJson }}
{{- end }}

{{/*
RBAC rules for the namespaced objects the operator reconciles, shared by the
ClusterRole (cluster-wide mode) and the per-namespace Roles (namespaced mode),
so the two modes can never grant different verbs. Why each rule exists:
- trainingjobs: kopf watches them and patches its own annotations and
  finalizers onto them (spec is never written); the operator deletes a
  finished job once ttlSecondsAfterFinished has passed.
- trainingjobs/finalizers: creating children with blockOwnerDeletion owner
  references needs it where OwnerReferencesPermissionEnforcement is enabled.
- pods/services/persistentvolumeclaims: the gang, its headless Service and the
  checkpoint volume. Pods are patched for the restart label only.
- events: kopf posts core/v1 Events; the operator's own use events.k8s.io.
- podgroups: gang scheduling with scheduler-plugins or Volcano.
*/}}
{{- define "torchfleet.rbac.namespacedRules" -}}
- apiGroups: ["torchfleet.dev"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch", "patch", "update", "delete"]
- apiGroups: ["torchfleet.dev"]
  resources: ["trainingjobs/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["torchfleet.dev"]
  resources: ["trainingjobs/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- range .Values.rbac.podGroupAPIGroups }}
- apiGroups: [{{ . | quote }}]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create", "delete"]
{{- end }}
{{- end }}

{{/*
Cluster-scoped reads kopf needs in both modes: it watches CRDs to notice the
TrainingJob resource appearing or going away (discovery itself needs no
grant). No namespaces access: cluster-wide, kopf never lists namespaces;
namespaced, it lists them only to expand glob patterns and, refused, falls
back to the exact names this chart passes.
*/}}
{{- define "torchfleet.rbac.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/*
Operator settings. Flags select what kopf watches and how it reports; the
TORCHFLEET_OPERATOR_* variables are the operator's tunables (config.py reads
every one of them by that prefix).
*/}}
{{- define "torchfleet.operator.args" -}}
- --log-level={{ .Values.operator.logLevel }}
- --liveness-port={{ .Values.operator.healthPort }}
- --metrics-port={{ .Values.operator.metricsPort }}
{{- range (include "torchfleet.watchNamespaces" . | fromJsonArray) }}
- --namespace={{ . }}
{{- else }}
- --all-namespaces
{{- end }}
{{- end }}

{{- define "torchfleet.operator.env" -}}
{{- $defaults := .Values.operator.defaults -}}
- name: TORCHFLEET_OPERATOR_DEFAULT_TRAINER_IMAGE
  value: {{ include "torchfleet.defaultTrainerImage" . | quote }}
- name: TORCHFLEET_OPERATOR_DEFAULT_SHM_SIZE
  value: {{ $defaults.shmSize | quote }}
- name: TORCHFLEET_OPERATOR_RESTART_BACKOFF_SECONDS
  value: {{ $defaults.restartBackoffSeconds | quote }}
- name: TORCHFLEET_OPERATOR_RESTART_BACKOFF_MAX_SECONDS
  value: {{ $defaults.restartBackoffMaxSeconds | quote }}
{{- end }}
