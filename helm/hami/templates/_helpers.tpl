{{/* Names, labels, images and the derived settings every template shares. */}}

{{- define "hami.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami.scheduler" -}}{{ include "hami.fullname" . }}-scheduler{{- end -}}
{{- define "hami.webhook" -}}{{ include "hami.fullname" . }}-webhook{{- end -}}
{{- define "hami.devicePlugin" -}}{{ include "hami.fullname" . }}-device-plugin{{- end -}}
{{- define "hami.certgen" -}}{{ include "hami.fullname" . }}-certgen{{- end -}}
{{- define "hami.tlsSecret" -}}{{ include "hami.fullname" . }}-webhook-tls{{- end -}}
{{- define "hami.deviceConfigMap" -}}{{ include "hami.fullname" . }}-scheduler-device{{- end -}}

{{- define "hami.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "scheduler"). */}}
{{- define "hami.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hami.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* labels/annotations of an object: (dict "root" $ "component" "x" ["labels" map] ["annotations" map]). */}}
{{- define "hami.metadata" -}}
labels:
  {{- include "hami.labels" .root | nindent 2 }}
  {{- if .component }}
  app.kubernetes.io/component: {{ .component }}
  {{- end }}
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $ann := merge (dict) (.annotations | default dict) (.root.Values.global.annotations | default dict) }}
{{- with $ann }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* One image reference: (dict "root" $ "image" .Values.x.image "tag" "override-tag-or-empty").
     global.imageRegistry replaces every registry; an empty tag falls back to global.imageTag, then to
     the chart's appVersion. */}}
{{- define "hami.image" -}}
{{- $registry := .image.registry -}}
{{- if .root.Values.global.imageRegistry -}}{{- $registry = .root.Values.global.imageRegistry -}}{{- end -}}
{{- $tag := .image.tag | default .tag | default .root.Values.global.imageTag | default .root.Chart.AppVersion -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" $registry .image.repository (toString $tag) -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (toString $tag) -}}
{{- end -}}
{{- end -}}

{{- define "hami.pullSecrets" -}}
{{- $secrets := concat (.Values.imagePullSecrets | default list) (.Values.global.imagePullSecrets | default list) -}}
{{- if $secrets }}
imagePullSecrets:
  {{- toYaml $secrets | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The cluster version without provider suffixes: v1.29.11-eks-1234 -> v1.29.11. */}}
{{- define "hami.kubeVersion" -}}
{{- regexFind "v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version | default "v1.30.0" -}}
{{- end -}}

{{/* The kube-scheduler image's version: scheduler.kubeScheduler.image.tag when set (v1.30.4, 1.30.4,
     v1.30.4-eks-..., with a v added), else the cluster's. "" when the tag is no version (validate.yaml
     refuses that). */}}
{{- define "hami.kubeSchedulerVersion" -}}
{{- $tag := toString (.Values.scheduler.kubeScheduler.image.tag | default "") -}}
{{- if $tag -}}
{{- $v := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" $tag -}}
{{- if $v }}{{ printf "v%s" (trimPrefix "v" $v) }}{{ end -}}
{{- else -}}
{{- include "hami.kubeVersion" . -}}
{{- end -}}
{{- end -}}

{{/* The KubeSchedulerConfiguration version the kube-scheduler image reads (upstream: v1beta2 from 1.22,
     v1beta3 from 1.23, v1 from 1.25; v1beta2 removed in 1.28, v1beta3 in 1.29): v1beta2 for 1.22,
     v1beta3 for 1.23 and 1.24, v1 from 1.25 on. validate.yaml refuses images before 1.22. */}}
{{- define "hami.schedulerConfigApiVersion" -}}
{{- $v := include "hami.kubeSchedulerVersion" . | default "v1.30.0" -}}
{{- if semverCompare ">=1.25.0-0" $v -}}
kubescheduler.config.k8s.io/v1
{{- else if semverCompare ">=1.23.0-0" $v -}}
kubescheduler.config.k8s.io/v1beta3
{{- else -}}
kubescheduler.config.k8s.io/v1beta2
{{- end -}}
{{- end -}}

{{- define "hami.leaderElect" -}}
{{- if or .Values.scheduler.leaderElect (gt (int .Values.scheduler.replicas) 1) -}}true{{- else -}}false{{- end -}}
{{- end -}}

{{/* "true" when the webhook is scoped by CEL matchConditions (Kubernetes 1.28+ and
     scheduler.admissionWebhook.matchConditions), else "": then failurePolicy holds only in namespaces
     labelled hami.io/webhook=enabled (webhook.yaml). */}}
{{- define "hami.webhookMatchConditions" -}}
{{- if and .Values.scheduler.admissionWebhook.matchConditions (semverCompare ">=1.28.0-0" (include "hami.kubeVersion" .)) -}}true{{- end -}}
{{- end -}}

{{- define "hami.webhookReplicas" -}}
{{- .Values.scheduler.admissionWebhook.replicas | int -}}
{{- end -}}

{{/* Every resource of every enabled vendor, each once (kube-scheduler refuses duplicate names). NVIDIA's
     and Hygon's come from the resource name values that also go into device-config.yaml; any other
     vendor's from devices.<vendor>.customresources and the resource* names of its deviceConfig.
     Rendered as a JSON list. */}}
{{- define "hami.managedResources" -}}
{{- $names := list -}}
{{- if .Values.devices.nvidia.enabled -}}
{{- $names = concat $names (list .Values.resourceName .Values.resourceMem .Values.resourceMemPercentage .Values.resourceCores .Values.resourcePriority) -}}
{{- end -}}
{{- if .Values.devices.hygon.enabled -}}
{{- $names = concat $names (list .Values.dcuResourceName .Values.dcuResourceMem .Values.dcuResourceCores) -}}
{{- end -}}
{{- range $vendor, $d := .Values.devices -}}
{{- if and (kindIs "map" $d) $d.enabled (ne $vendor "nvidia") (ne $vendor "hygon") -}}
{{- $names = concat $names ($d.customresources | default list) -}}
{{- $sections := list -}}
{{- if kindIs "map" $d.deviceConfig -}}{{- $sections = append $sections $d.deviceConfig -}}{{- end -}}
{{- /* Ascend's chips (vnpus.configs, or HAMi's older list form) name their own resources. */ -}}
{{- $chips := list -}}
{{- if kindIs "slice" $d.deviceConfig -}}{{- $chips = $d.deviceConfig -}}
{{- else if and (kindIs "map" $d.deviceConfig) (kindIs "slice" (get ($d.deviceConfig | default dict) "configs")) -}}{{- $chips = $d.deviceConfig.configs -}}
{{- end -}}
{{- range $chips -}}{{- if kindIs "map" . -}}{{- $sections = append $sections . -}}{{- end -}}{{- end -}}
{{- range $section := $sections -}}
{{- range $key, $value := $section -}}
{{- if and (hasPrefix "resource" $key) (kindIs "string" $value) $value -}}
{{- $names = append $names $value -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{- define "hami.extenderUrl" -}}
http://127.0.0.1:{{ .Values.scheduler.extender.port }}
{{- end -}}

{{/* Scheduling constraints shared by the Deployments: explicit affinity wins; with more than one
     replica, prefer spreading over nodes. (dict "root" $ "component" "scheduler" "values" .Values.scheduler "replicas" N) */}}
{{- define "hami.affinity" -}}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if gt (int .replicas) 1 }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "hami.selectorLabels" (dict "root" .root "component" .component) | nindent 14 }}
{{- end }}
{{- end -}}

{{/* A list of strings as a CEL list body: 'a', 'b'. */}}
{{- define "hami.celList" -}}
{{- $q := list -}}
{{- range . }}{{ $q = append $q (printf "'%s'" .) }}{{ end -}}
{{- join ", " $q -}}
{{- end -}}

{{/* nodePort of a metrics Service port: (dict "type" .service.type "port" N). HAMi's chart serves these
     Services as NodePort on the port number itself (31993, 31992) and Prometheus setups scrape the nodes
     there, so a NodePort Service whose port lies in the node-port range keeps it as its nodePort; any
     other port is left to the API server to choose. */}}
{{- define "hami.nodePort" -}}
{{- $port := int .port -}}
{{- if and (eq .type "NodePort") (ge $port 30000) (le $port 32767) -}}
nodePort: {{ $port }}
{{- end -}}
{{- end -}}

{{/* Each item of a list as JSON, NUL-separated (for messages that list accepted values). */}}
{{- define "hami.jsonEach" -}}
{{- range . }}{{ toJson . }}{{ "\x00" }}{{ end -}}
{{- end -}}
